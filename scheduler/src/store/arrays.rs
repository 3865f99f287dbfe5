//! Array parameters of batch statements, one array a column, that send less when a batch
//! allows: a column NULL for every row as one NULL ([`Sparse`]), a column the whole batch
//! shares as one element ([`Uniform`]).

use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

/// A column that is NULL for most rows: a batch in which every row has it NULL sends one NULL
/// instead of an array of NULLs. Both ways a batch statement steps through its arrays (several
/// `unnest`s in a select list, or one `unnest` of several arrays in FROM) pad the arrays that
/// run out with NULLs, and an `unnest` of NULL runs out at once, so every row still reads NULL
/// while the database neither receives nor steps through the array. Sixteen such inputs of
/// the create were about 7 % of S2's PostgreSQL CPU (docs/performance.md).
#[derive(Debug)]
pub(crate) struct Sparse<T>(pub(crate) Vec<Option<T>>);

impl<T> Default for Sparse<T> {
    fn default() -> Self {
        Sparse(Vec::new())
    }
}

impl<T: ToSql> ToSql for Sparse<T> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        if self.0.iter().all(Option::is_none) {
            return Ok(IsNull::Yes);
        }
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        <Vec<Option<T>> as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

/// A column that is never NULL and often the same for every row of a batch: such a batch sends
/// it as a one-element array, instead of a thousand equal elements. The statement must read
/// the padding of the exhausted `unnest` as the array's first element, as the create's does
/// (`Sent::Uniform` in `store/tasks/columns.rs`).
#[derive(Debug)]
pub(crate) struct Uniform<T>(pub(crate) Vec<T>);

impl<T> Default for Uniform<T> {
    fn default() -> Self {
        Uniform(Vec::new())
    }
}

impl<T: ToSql + PartialEq> ToSql for Uniform<T> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self.0.split_first() {
            Some((first, rest)) if rest.iter().all(|v| v == first) => {
                std::slice::from_ref(first).to_sql(ty, out)
            }
            _ => self.0.to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <Vec<T> as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scratch::ScratchStore;

    /// The batch statements rely on PostgreSQL padding a select list's shorter `unnest`s with
    /// NULLs: a column sent as one NULL must read NULL for every row, and a column with any
    /// value must keep each value beside its own row.
    #[tokio::test]
    async fn a_column_null_for_every_row_is_sent_as_one_null_and_reads_null_for_each() {
        let store = ScratchStore::new().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        let ids = vec![1_i64, 2, 3];
        let none: Sparse<&str> = Sparse(vec![None, None, None]);
        let some: Sparse<&str> = Sparse(vec![None, Some("b"), None]);
        let rows = conn
            .query(
                "SELECT unnest($1::bigint[]) AS id, unnest($2::text[]) AS none, \
                        unnest($3::text[]) AS some, $2::text[] IS NULL AS sent_as_null",
                &[&ids, &none, &some],
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let read: Vec<(i64, Option<String>, Option<String>, bool)> = rows
            .iter()
            .map(|r| {
                (
                    r.get("id"),
                    r.get("none"),
                    r.get("some"),
                    r.get("sent_as_null"),
                )
            })
            .collect();
        assert_eq!(
            read,
            vec![
                (1, None, None, true),
                (2, None, Some("b".to_owned()), true),
                (3, None, None, true),
            ]
        );
    }

    /// A uniform column shared by the whole batch travels as one element and reads as that
    /// element for every row, through the create's two levels; one that differs keeps each
    /// row's own value.
    #[tokio::test]
    async fn a_uniform_column_shared_by_the_batch_is_sent_once_and_reads_for_each_row() {
        let store = ScratchStore::new().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        let ids = vec![1_i64, 2, 3];
        let read = |shared: Uniform<i32>| {
            let conn = &conn;
            let ids = &ids;
            async move {
                let rows = conn
                    .query(
                        "SELECT u.id, COALESCE(u.priority, ($2::integer[])[1]) AS priority, \
                                array_length($2::integer[], 1) AS sent \
                         FROM (SELECT unnest($1::bigint[]) AS id, \
                                      unnest($2::integer[]) AS priority) AS u",
                        &[ids, &shared],
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                rows.iter()
                    .map(|r| {
                        let read: (i64, i32, i32) = (r.get("id"), r.get("priority"), r.get("sent"));
                        read
                    })
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(
            read(Uniform(vec![5, 5, 5])).await,
            vec![(1, 5, 1), (2, 5, 1), (3, 5, 1)]
        );
        assert_eq!(
            read(Uniform(vec![5, 7, 5])).await,
            vec![(1, 5, 3), (2, 7, 3), (3, 5, 3)]
        );
    }
}
