//! List pages that a client's default message limit accepts.

use prost::Message;

/// Most encoded bytes of items in one page of a List answer. A page holds fewer than its
/// `page_size` items when they would not fit, and its `next_page_token` goes on from the last
/// one kept (AIP-158 lets a server return fewer than asked): gRPC clients refuse answers over
/// 4 MiB by default, and a page of 1,000 items with 64 KB of content each would be 64 MB.
pub const MAX_PAGE_BYTES: usize = 3 * 1024 * 1024;

/// `items`, the wire forms of `records` (a page already cut to its size, whose
/// `next_page_token` goes on after the last), cut further to the first ones that fit in
/// [`MAX_PAGE_BYTES`] (at least one), with the token to go on from the last kept: `token` of
/// its record, or `next_page_token` when every item fits.
pub fn fit<R, W: Message>(
    records: &[R],
    mut items: Vec<W>,
    next_page_token: String,
    token: impl Fn(&R) -> String,
) -> (Vec<W>, String) {
    let mut bytes = 0;
    let mut keep = items.len();
    for (i, item) in items.iter().enumerate() {
        bytes += item.encoded_len();
        if bytes > MAX_PAGE_BYTES {
            keep = i.max(1);
            break;
        }
    }
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
        let items = vec![item(MAX_PAGE_BYTES + 1), item(1)];
        let (kept, next) = fit(&records, items, String::new(), |r| format!("after-{r}"));
        assert_eq!(kept.len(), 1);
        assert_eq!(next, "after-7");
    }
}
