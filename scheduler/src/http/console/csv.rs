//! CSV exports, streamed a page at a time: the response starts with the header row and each
//! page of rows follows as soon as it is read, so a 100,000-row export holds one page in memory,
//! never the whole list. Each page is one of the list's own bounded queries.

use std::future::Future;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::Error;

/// One page of rows and where the next page starts (None after the last).
pub(super) type Page<C> = (Vec<Vec<String>>, Option<C>);

/// Quotes a field when it needs it (RFC 4180): commas, quotes, line breaks. A field that a
/// spreadsheet would read as a formula is prefixed with `'` so an export cannot run one: one
/// starting with a formula character, or with a tab or carriage return (which some spreadsheets
/// skip before reading the formula; OWASP's CSV injection list). Numbers stay numbers.
fn field(out: &mut String, value: &str) {
    let formula =
        value.starts_with(['=', '+', '-', '@', '\t', '\r']) && value.parse::<f64>().is_err();
    let quote = formula || value.contains([',', '"', '\n', '\r']);
    if quote {
        out.push('"');
        if formula {
            out.push('\'');
        }
        out.push_str(&value.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(value);
    }
}

fn line(out: &mut String, row: &[impl AsRef<str>]) {
    for (i, value) in row.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        field(out, value.as_ref());
    }
    out.push_str("\r\n");
}

/// Streams `columns` and then every page `fetch` returns, from `start` on, as `filename`.
pub(super) fn stream<C, F, Fut>(
    filename: &str,
    columns: &'static [&'static str],
    start: C,
    fetch: F,
) -> Response
where
    C: Send + 'static,
    F: Fn(C) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Page<C>, Error>> + Send + 'static,
{
    let pages = futures::stream::unfold(
        (Some(start), true, fetch),
        move |(cursor, first, fetch)| async move {
            let cursor = cursor?;
            let mut out = String::new();
            if first {
                line(&mut out, columns);
            }
            match fetch(cursor).await {
                Ok((rows, next)) => {
                    for row in &rows {
                        line(&mut out, row);
                    }
                    Some((Ok(Bytes::from(out)), (next, false, fetch)))
                }
                Err(e) => {
                    // The status line is already sent: cutting the body short is how the
                    // client learns the export is incomplete.
                    tracing::warn!(error = %e, "console: export stopped");
                    Some((
                        Err(std::io::Error::other(format!("export stopped: {e}"))),
                        (None, false, fetch),
                    ))
                }
            }
        },
    );
    (
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{filename}\""),
            ),
        ],
        Body::from_stream(pages),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_what_needs_quoting() {
        let mut out = String::new();
        line(
            &mut out,
            &[
                "a",
                "b,c",
                "say \"hi\"",
                "=cmd()",
                "-1.5",
                "x\ny",
                "\t=HYPERLINK(1)",
                "\r=1+2",
            ],
        );
        assert_eq!(
            out,
            "a,\"b,c\",\"say \"\"hi\"\"\",\"'=cmd()\",-1.5,\"x\ny\",\"'\t=HYPERLINK(1)\",\"'\r=1+2\"\r\n"
        );
    }
}
