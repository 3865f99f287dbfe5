//! List pages, and other answers that carry contents, that a client's default message limit
//! accepts.

use prost::Message;

/// Most encoded bytes of items in one answer that carries contents. A List page holds fewer
/// than its `page_size` items when they would not fit, and its `next_page_token` goes on from
/// the last one kept (AIP-158 lets a server return fewer than asked); a CreateTasks answer
/// leaves the contents out. gRPC clients refuse answers over 4 MiB by default, and a page of
/// 1,000 items with 64 KB of content each would be 64 MB.
pub const MAX_ANSWER_BYTES: usize = 3 * 1024 * 1024;

/// One page of a List answer, from rows read with `limit + 1`: the rows it keeps, and the token
/// that goes on after them. Every List call goes through it, so that each names how a row makes
/// a page token once and no page is larger than a client accepts.
pub struct Page<R, T> {
    rows: Vec<R>,
    next_page_token: String,
    token: T,
}

impl<R, T: Fn(&R) -> String> Page<R, T> {
    /// At most `limit` of `rows` (read with `limit + 1`), with `token` of the last kept as the
    /// next page's token when another row followed; empty at the list's end.
    pub fn new(rows: Vec<R>, limit: i64, token: T) -> Self {
        let (rows, next_page_token) = crate::store::sql::page(rows, limit, &token);
        Page {
            rows,
            next_page_token,
            token,
        }
    }

    /// The rows of the page, for the lookups their wire forms need.
    pub fn rows(&self) -> &[R] {
        &self.rows
    }

    /// The answer: `items`, the wire forms of [`Page::rows`] in order, cut to those that fit in
    /// [`MAX_ANSWER_BYTES`], and the token to go on after the last one kept.
    pub fn answer<W: Message>(self, items: Vec<W>) -> (Vec<W>, String) {
        fit(&self.rows, items, self.next_page_token, self.token)
    }

    /// The answer with each row made a wire item by `to_wire`, as [`Page::answer`].
    pub fn map<W: Message, E>(
        self,
        to_wire: impl FnMut(&R) -> Result<W, E>,
    ) -> Result<(Vec<W>, String), E> {
        let items = self.rows.iter().map(to_wire).collect::<Result<_, E>>()?;
        Ok(self.answer(items))
    }
}

/// How many of `items`, from the first, fit in [`MAX_ANSWER_BYTES`]; at least one. The one
/// rule every answer that carries contents is held to.
pub fn fitting<W: Message>(items: &[W]) -> usize {
    let mut bytes = 0;
    for (i, item) in items.iter().enumerate() {
        bytes += item.encoded_len();
        if bytes > MAX_ANSWER_BYTES {
            return i.max(1);
        }
    }
    items.len()
}

/// `items`, the wire forms of `records` (a page already cut to its size, whose
/// `next_page_token` goes on after the last), cut further to the first ones that fit in
/// [`MAX_ANSWER_BYTES`] (at least one), with the token to go on from the last kept: `token` of
/// its record, or `next_page_token` when every item fits.
fn fit<R, W: Message>(
    records: &[R],
    mut items: Vec<W>,
    next_page_token: String,
    token: impl Fn(&R) -> String,
) -> (Vec<W>, String) {
    let keep = fitting(&items);
    if keep == items.len() {
        return (items, next_page_token);
    }
    items.truncate(keep);
    let next = records.get(keep - 1).map(token).unwrap_or(next_page_token);
    (items, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(bytes: usize) -> String {
        "x".repeat(bytes)
    }

    #[test]
    fn a_page_that_fits_is_kept_whole_with_its_token() {
        let records = [1, 2, 3];
        let items: Vec<String> = records.iter().map(|_| item(10)).collect();
        let (kept, next) = fit(&records, items, "after-3".into(), |r| format!("after-{r}"));
        assert_eq!(kept.len(), 3);
        assert_eq!(next, "after-3");
    }

    #[test]
    fn a_page_too_large_ends_early_and_goes_on_from_its_last_item() {
        let records: Vec<u32> = (1..=10).collect();
        let items: Vec<String> = records.iter().map(|_| item(1024 * 1024)).collect();
        let (kept, next) = fit(&records, items, String::new(), |r| format!("after-{r}"));
        assert_eq!(
            kept.len(),
            2,
            "two items of 1 MiB fit in 3 MiB, three do not"
        );
        assert_eq!(next, "after-2");
    }

    #[test]
    fn one_item_larger_than_the_limit_still_makes_a_page() {
        let records = [7, 8];
        let items = vec![item(MAX_ANSWER_BYTES + 1), item(1)];
        let (kept, next) = fit(&records, items, String::new(), |r| format!("after-{r}"));
        assert_eq!(kept.len(), 1);
        assert_eq!(next, "after-7");
    }

    #[test]
    fn a_page_keeps_its_limit_and_goes_on_after_its_last_row() {
        let page = Page::new(vec![1, 2, 3, 4], 3, |r: &u32| format!("after-{r}"));
        assert_eq!(page.rows(), [1, 2, 3]);
        let (kept, next) = page.map(|_| Ok::<_, ()>(item(10))).unwrap_or_default();
        assert_eq!((kept.len(), next.as_str()), (3, "after-3"));
    }

    #[test]
    fn the_last_page_has_no_token_unless_it_is_cut() {
        let whole = Page::new(vec![1, 2], 3, |r: &u32| format!("after-{r}"));
        assert_eq!(whole.answer(vec![item(10), item(10)]).1, "");
        let cut = Page::new(vec![1, 2], 3, |r: &u32| format!("after-{r}"));
        let (kept, next) = cut.answer(vec![item(MAX_ANSWER_BYTES), item(10)]);
        assert_eq!((kept.len(), next.as_str()), (1, "after-1"));
    }
}
