//! How large a lease-stream message may be. Both services split what they send by it: gRPC
//! peers refuse messages over 4 MiB by default, and a refused message breaks the stream, so a
//! claim of large tasks or a burst of long error texts must never make one.

/// Most encoded bytes of leases (a `LeaseBatch`) or results (a `ReportBatch`) in one message: a
/// quarter of the 4 MiB every gRPC peer accepts by default.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

/// `items`, each with at least the bytes it takes on the wire, in batches of at most
/// `max_count` items and [`MAX_FRAME_BYTES`] (an item larger than that alone goes in a batch of
/// its own), in their order.
pub fn batches<T>(items: impl IntoIterator<Item = (usize, T)>, max_count: usize) -> Vec<Vec<T>> {
    let mut batches = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0;
    for (size, item) in items {
        if !current.is_empty() && (current.len() >= max_count || bytes + size > MAX_FRAME_BYTES) {
            batches.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += size;
        current.push(item);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(batches: &[Vec<usize>]) -> Vec<usize> {
        batches.iter().map(Vec::len).collect()
    }

    #[test]
    fn large_items_are_split_under_the_limit_in_order() {
        let items: Vec<usize> = (0..40).collect();
        let batches = batches(items.iter().map(|i| (100_000, *i)), 1000);
        assert_eq!(sizes(&batches), [10, 10, 10, 10]);
        assert_eq!(batches.concat(), items);
    }

    #[test]
    fn small_items_are_split_by_count() {
        let batches = batches((0..2500).map(|i| (10, i)), 1000);
        assert_eq!(sizes(&batches), [1000, 1000, 500]);
    }

    #[test]
    fn an_item_over_the_limit_goes_alone() {
        let items = [(10, 0), (MAX_FRAME_BYTES + 1, 1), (10, 2)];
        assert_eq!(sizes(&batches(items, 1000)), [1, 1, 1]);
    }

    #[test]
    fn nothing_makes_no_batch() {
        assert!(batches(Vec::<(usize, u8)>::new(), 1000).is_empty());
    }
}
