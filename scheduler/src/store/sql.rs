//! Named statements and rows decoded by column name: the two things every repository does.
//!
//! A [`Statement`] is a `.sql` file beside the repository that runs it (see [`statement!`]). It
//! is prepared once per pooled connection and its file name is the context of every error it
//! raises, so a failure says which statement failed. Rows are read with [`column`], by name:
//! a column list and its mapper that fall out of step fail one request with an error naming the
//! column, never a panic.

use deadpool_postgres::GenericClient;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::Row;

use super::StoreError;

/// One SQL statement: its name (the `.sql` file it comes from) and its text.
#[derive(Debug, Clone, Copy)]
pub struct Statement {
    name: &'static str,
    text: &'static str,
}

/// The statement in `<name>.sql`, beside the file that invokes the macro.
macro_rules! statement {
    ($name:literal) => {
        $crate::store::sql::Statement::new($name, include_str!(concat!($name, ".sql")))
    };
}
pub(crate) use statement;

/// A duration as the whole milliseconds the statements take (`$n::bigint * interval '1
/// millisecond'`); one too long for a bigint is the largest.
pub fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Parameters of a statement, as tokio-postgres takes them.
pub type Params<'a> = [&'a (dyn ToSql + Sync)];

impl Statement {
    /// A statement named `name` (used in errors) with the given text.
    pub const fn new(name: &'static str, text: &'static str) -> Self {
        Statement { name, text }
    }

    /// A statement whose text is built once at start-up (templated statements): the text is
    /// kept for the life of the process, as a static statement's is.
    pub fn built(name: &'static str, text: String) -> Self {
        Statement {
            name,
            text: Box::leak(text.into_boxed_str()),
        }
    }

    /// The statement's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The statement's text.
    pub fn text(&self) -> &'static str {
        self.text
    }

    async fn prepare(
        &self,
        client: &impl GenericClient,
    ) -> Result<tokio_postgres::Statement, StoreError> {
        client
            .prepare_cached(self.text)
            .await
            .map_err(StoreError::query(self.name))
    }

    /// Runs the statement and returns its rows.
    pub async fn query(
        &self,
        client: &impl GenericClient,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let stmt = self.prepare(client).await?;
        client
            .query(&stmt, params)
            .await
            .map_err(StoreError::query(self.name))
    }

    /// Runs the statement, which returns exactly one row.
    pub async fn query_one(
        &self,
        client: &impl GenericClient,
        params: &Params<'_>,
    ) -> Result<Row, StoreError> {
        let stmt = self.prepare(client).await?;
        client
            .query_one(&stmt, params)
            .await
            .map_err(StoreError::query(self.name))
    }

    /// Runs the statement, which returns at most one row.
    pub async fn query_opt(
        &self,
        client: &impl GenericClient,
        params: &Params<'_>,
    ) -> Result<Option<Row>, StoreError> {
        let stmt = self.prepare(client).await?;
        client
            .query_opt(&stmt, params)
            .await
            .map_err(StoreError::query(self.name))
    }

    /// Runs the statement and returns how many rows it changed.
    pub async fn execute(
        &self,
        client: &impl GenericClient,
        params: &Params<'_>,
    ) -> Result<u64, StoreError> {
        let stmt = self.prepare(client).await?;
        client
            .execute(&stmt, params)
            .await
            .map_err(StoreError::query(self.name))
    }

    /// Runs the statement and decodes every row.
    pub async fn fetch<T: FromRow>(
        &self,
        client: &impl GenericClient,
        params: &Params<'_>,
    ) -> Result<Vec<T>, StoreError> {
        let rows = self.query(client, params).await?;
        // Sized up front: collecting `Result`s gives no lower bound, and growing a vector of
        // large rows (a claim's 512 leases) copied it about once over per batch.
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(T::from_row(row)?);
        }
        Ok(out)
    }

    /// Runs the statement and decodes its row, if any.
    pub async fn fetch_opt<T: FromRow>(
        &self,
        client: &impl GenericClient,
        params: &Params<'_>,
    ) -> Result<Option<T>, StoreError> {
        self.query_opt(client, params)
            .await?
            .as_ref()
            .map(T::from_row)
            .transpose()
    }
}

/// A value read from a row by column names, kept beside the column list that selects them.
pub trait FromRow: Sized {
    /// Decodes one row.
    fn from_row(row: &Row) -> Result<Self, StoreError>;
}

/// The value of column `name`; a missing column or a type that does not match is an error
/// naming the column.
pub fn column<'r, T: FromSql<'r>>(row: &'r Row, name: &str) -> Result<T, StoreError> {
    row.try_get(name)
        .map_err(|e| StoreError::Corrupt(format!("column {name}: {e}")))
}

/// One row's columns read by name, in about the order the SELECT lists them: each lookup tries
/// the column after the one read before it first. tokio-postgres finds a column by comparing
/// its name with each column's in turn, which for the 42 columns of a task row was ~15 % of the
/// scheduler's CPU on the create path (docs/performance.md, S2); decoders that read in SELECT
/// order make each lookup one comparison, and any other order still finds the column.
pub struct Columns<'r> {
    row: &'r Row,
    next: usize,
}

impl<'r> Columns<'r> {
    /// A reader of `row`, starting at its first column.
    pub fn new(row: &'r Row) -> Self {
        Columns { row, next: 0 }
    }

    /// The value of column `name`; a missing column or a type that does not match is an error
    /// naming the column.
    pub fn get<T: FromSql<'r>>(&mut self, name: &str) -> Result<T, StoreError> {
        let columns = self.row.columns();
        let count = columns.len();
        let index = (0..count)
            .map(|k| (self.next + k) % count)
            .find(|&i| columns[i].name() == name)
            .ok_or_else(|| StoreError::Corrupt(format!("column {name}: not in the row")))?;
        self.next = index + 1;
        self.row
            .try_get(index)
            .map_err(|e| StoreError::Corrupt(format!("column {name}: {e}")))
    }
}

/// Announces on a NOTIFY channel; delivered when the surrounding transaction commits.
pub async fn notify(
    client: &impl GenericClient,
    channel: &'static str,
    payload: &str,
) -> Result<(), StoreError> {
    const NOTIFY: Statement = Statement::new("notify", "SELECT pg_notify($1, $2)");
    NOTIFY.execute(client, &[&channel, &payload]).await?;
    Ok(())
}

/// One page of a list read with `limit + 1` rows: at most `limit` of them, and the token made
/// from the last kept row only when another row followed, so a list ends on its last page
/// instead of on an empty one after it.
pub fn page<T>(mut rows: Vec<T>, limit: i64, token: impl Fn(&T) -> String) -> (Vec<T>, String) {
    let keep = usize::try_from(limit.max(0)).unwrap_or(usize::MAX);
    if rows.len() <= keep {
        return (rows, String::new());
    }
    rows.truncate(keep);
    let next = rows.last().map(token).unwrap_or_default();
    (rows, next)
}
