//! Results on their way to the scheduler as `ReportBatch` messages under the lease stream's
//! size limit ([`herald_proto::framing`]). A thousand failed results with 4 KB errors each are
//! about the scheduler's default 4 MiB: refused, the batch would be sent again on every
//! reconnect while its leases ran out and were leased again, to be sent a second time.

use herald_proto::framing;
use herald_proto::v1 as pb;

/// `results` as ReportBatch messages of at most `max_count` results each and under the size
/// limit, in their order.
pub(crate) fn report_batches<'a>(
    results: impl Iterator<Item = &'a pb::AttemptResult>,
    max_count: usize,
) -> Vec<pb::ReportBatch> {
    let sized = results.map(|r| (size_bound(r), r.clone()));
    framing::batches(sized, max_count)
        .into_iter()
        .map(|results| pb::ReportBatch { results })
        .collect()
}

/// At least the bytes `result` takes in a ReportBatch: its strings, each with a tag and a
/// length, and a fixed allowance for its numbers, timestamps and its own tag and length.
fn size_bound(result: &pb::AttemptResult) -> usize {
    const FIELD: usize = 6;
    const FIXED: usize = 96;
    result.task_id.len() + result.error.len() + result.provider_message_id.len() + 3 * FIELD + FIXED
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn failed(n: usize, error_bytes: usize) -> pb::AttemptResult {
        pb::AttemptResult {
            task_id: format!("00000000-0000-4000-8000-{n:012}"),
            attempt: i32::MAX,
            outcome: pb::OutcomeClass::Transient as i32,
            error: "e".repeat(error_bytes),
            retry_after: Some(prost_types::Duration {
                seconds: i64::MAX,
                nanos: 999_999_999,
            }),
            provider_message_id: "wamid.".repeat(20),
            started_at: Some(prost_types::Timestamp {
                seconds: i64::MAX,
                nanos: 999_999_999,
            }),
            rate_limit_scope: pb::RateLimitScope::Recipient as i32,
            error_code: i64::MAX,
            window_closed_fallback: true,
            outcome_unknown: true,
        }
    }

    #[test]
    fn the_size_bound_is_never_below_the_encoded_size() {
        let result = failed(1, 4096);
        let len = result.encoded_len();
        assert!(size_bound(&result) >= len + 1 + prost::length_delimiter_len(len));
    }

    #[test]
    fn a_thousand_long_errors_go_in_batches_under_the_limit_in_order() {
        let results: Vec<pb::AttemptResult> = (0..1000).map(|n| failed(n, 4096)).collect();
        let batches = report_batches(results.iter(), 1000);
        assert!(
            batches.len() >= 4,
            "4 MB of results in {} batches",
            batches.len()
        );
        for batch in &batches {
            assert!(batch.encoded_len() <= framing::MAX_FRAME_BYTES);
        }
        let sent: Vec<&str> = batches
            .iter()
            .flat_map(|b| b.results.iter().map(|r| r.task_id.as_str()))
            .collect();
        let asked: Vec<&str> = results.iter().map(|r| r.task_id.as_str()).collect();
        assert_eq!(sent, asked);
    }

    #[test]
    fn short_results_go_a_thousand_at_a_time() {
        let results: Vec<pb::AttemptResult> = (0..2500).map(|n| failed(n, 0)).collect();
        let sizes: Vec<usize> = report_batches(results.iter(), 1000)
            .iter()
            .map(|b| b.results.len())
            .collect();
        assert_eq!(sizes, [1000, 1000, 500]);
    }
}
