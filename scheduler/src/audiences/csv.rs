//! Reading contacts from a CSV file that arrives as a stream of byte chunks.
//!
//! The `csv` crate reads from `std::io::Read`, so the parser runs on a blocking thread fed
//! through a bounded channel of chunks, and hands back bounded batches of rows: at most
//! [`CHUNKS_IN_FLIGHT`] chunks and two batches are in memory whatever the file's size, and a
//! slow database slows the client down (back-pressure through both channels and HTTP/2).

use std::cell::Cell;
use std::collections::HashSet;
use std::io::Read;
use std::rc::Rc;

use tokio::sync::mpsc;

use super::model::{attribute_name_problem, Contact};
use super::{ImportRow, RowError};
use crate::error::Error;

/// Rows per batch (one transaction each).
pub const BATCH_ROWS: usize = 1_000;
/// Chunks buffered between the stream and the parser.
const CHUNKS_IN_FLIGHT: usize = 4;
/// The longest row (the header row included) read before the file is refused: the parser holds
/// a row whole, so an unterminated quote or a row without end would otherwise grow it until the
/// scheduler ran out of memory.
pub const MAX_ROW_BYTES: usize = 1 << 20;
/// The columns that are a contact's own fields; every other column is an attribute.
const FIELDS: [&str; 5] = ["recipient", "name", "time_zone", "locale", "tags"];

/// The write end of the chunk channel and the read end of the batch channel of one parse.
pub struct CsvParse {
    /// Chunks of the file, in order, then `None` at its end. Dropped before that, it means the
    /// upload broke off: the parse ends with [`Error::Cancelled`], and the row it was reading
    /// (cut off, so perhaps a stranger's number or a contact with its fields missing) is not
    /// handed on as a row.
    pub chunks: mpsc::Sender<Option<Vec<u8>>>,
    /// Batches of rows, then the end of the file; an `Err` (a bad header) ends the parse.
    pub batches: mpsc::Receiver<Result<Vec<ImportRow>, Error>>,
}

/// Starts a parser on a blocking thread.
pub fn spawn() -> CsvParse {
    let (chunk_tx, chunk_rx) = mpsc::channel::<Option<Vec<u8>>>(CHUNKS_IN_FLIGHT);
    let (batch_tx, batch_rx) = mpsc::channel(1);
    tokio::task::spawn_blocking(move || {
        let reader = ChunkReader {
            chunks: chunk_rx,
            current: Vec::new(),
            pos: 0,
        };
        parse(reader, &|batch| batch_tx.blocking_send(batch).is_ok());
    });
    CsvParse {
        chunks: chunk_tx,
        batches: batch_rx,
    }
}

/// What a parse ends with when the chunks stopped before the file's end.
const UPLOAD_BROKE_OFF: &str = "the upload ended before the end of the file";

/// `Read` over the chunks of a channel, on a blocking thread.
struct ChunkReader {
    chunks: mpsc::Receiver<Option<Vec<u8>>>,
    current: Vec<u8>,
    pos: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos >= self.current.len() {
            match self.chunks.blocking_recv() {
                Some(Some(chunk)) => {
                    self.current = chunk;
                    self.pos = 0;
                }
                Some(None) => return Ok(0),
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        UPLOAD_BROKE_OFF,
                    ))
                }
            }
        }
        let n = buf.len().min(self.current.len() - self.pos);
        buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// `Read` that fails once more than [`MAX_ROW_BYTES`] were read since the parser last took a
/// row (it resets `since_row`). The parser reads ahead by at most its buffer, a few KiB.
struct RowLimit<R> {
    inner: R,
    since_row: Rc<Cell<usize>>,
}

impl<R: Read> Read for RowLimit<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.since_row.get() > MAX_ROW_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a row is longer than {} MiB (an unclosed quote?)",
                    MAX_ROW_BYTES >> 20
                ),
            ));
        }
        let n = self.inner.read(buf)?;
        self.since_row.set(self.since_row.get() + n);
        Ok(n)
    }
}

/// Where each column goes.
struct Columns {
    recipient: usize,
    name: Option<usize>,
    time_zone: Option<usize>,
    locale: Option<usize>,
    tags: Option<usize>,
    /// (column, attribute name).
    attributes: Vec<(usize, String)>,
    count: usize,
}

impl Columns {
    /// Reads the header row; a header that cannot name every column is refused whole.
    fn of(header: &csv::StringRecord) -> Result<Self, Error> {
        let names: Vec<String> = header.iter().map(|h| h.trim().to_owned()).collect();
        let mut seen = HashSet::new();
        for (i, n) in names.iter().enumerate() {
            if !seen.insert(n.as_str()) {
                return Err(Error::invalid(
                    "data",
                    format!("header column {} ({n:?}) appears twice", i + 1),
                ));
            }
            if !FIELDS.contains(&n.as_str()) {
                if let Some(p) = attribute_name_problem(n) {
                    return Err(Error::invalid(
                        "data",
                        format!(
                            "header column {} ({n:?}) names an attribute that {p}",
                            i + 1
                        ),
                    ));
                }
            }
        }
        let at = |f: &str| names.iter().position(|n| n == f);
        let recipient = at("recipient")
            .ok_or_else(|| Error::invalid("data", "the header row has no recipient column"))?;
        Ok(Columns {
            recipient,
            name: at("name"),
            time_zone: at("time_zone"),
            locale: at("locale"),
            tags: at("tags"),
            attributes: names
                .iter()
                .enumerate()
                .filter(|(_, n)| !FIELDS.contains(&n.as_str()))
                .map(|(i, n)| (i, n.clone()))
                .collect(),
            count: names.len(),
        })
    }

    fn contact(&self, r: &csv::StringRecord) -> Contact {
        let cell = |i: Option<usize>| {
            i.and_then(|i| r.get(i))
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        Contact {
            recipient: cell(Some(self.recipient)),
            name: cell(self.name),
            time_zone: cell(self.time_zone),
            locale: cell(self.locale),
            tags: cell(self.tags)
                .split(';')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
            attributes: self
                .attributes
                .iter()
                .filter_map(|(i, name)| {
                    let v = r.get(*i)?.trim();
                    (!v.is_empty()).then(|| (name.clone(), v.to_owned()))
                })
                .collect(),
            ..Default::default()
        }
    }
}

/// Parses `reader` and hands each batch to `send` (false: nobody listens any more).
fn parse(reader: impl Read, send: &dyn Fn(Result<Vec<ImportRow>, Error>) -> bool) {
    let since_row = Rc::new(Cell::new(0));
    let mut csv = csv::ReaderBuilder::new()
        .flexible(true)
        .has_headers(true)
        .from_reader(RowLimit {
            inner: reader,
            since_row: Rc::clone(&since_row),
        });
    let columns = match csv.headers() {
        Ok(h) if h.is_empty() => Err(Error::invalid("data", "the file is empty")),
        Ok(h) => Columns::of(h),
        Err(e) => Err(Error::invalid(
            "data",
            format!("the header row cannot be read: {e}"),
        )),
    };
    let columns = match columns {
        Ok(c) => c,
        Err(e) => {
            send(Err(e));
            return;
        }
    };
    let mut batch = Vec::with_capacity(BATCH_ROWS);
    let mut record = csv::StringRecord::new();
    loop {
        since_row.set(0);
        let row = match csv.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {
                let line = record.position().map_or(0, |p| p.line() as i64);
                if record.len() > columns.count {
                    ImportRow::Bad(RowError {
                        line,
                        field: String::new(),
                        reason: format!(
                            "has {} fields, the header has {}",
                            record.len(),
                            columns.count
                        ),
                    })
                } else {
                    ImportRow::Contact {
                        line,
                        contact: columns.contact(&record),
                    }
                }
            }
            // A row that is not UTF-8 is that row's problem; the next row is read as usual.
            Err(e) if matches!(e.kind(), csv::ErrorKind::Utf8 { .. }) => ImportRow::Bad(RowError {
                line: e.position().map_or(0, |p| p.line() as i64),
                field: String::new(),
                reason: "is not UTF-8".into(),
            }),
            Err(e)
                if matches!(e.kind(), csv::ErrorKind::Io(io)
                                  if io.kind() == std::io::ErrorKind::UnexpectedEof) =>
            {
                send(Err(Error::Cancelled(UPLOAD_BROKE_OFF.into())));
                return;
            }
            Err(e) => {
                send(Err(Error::invalid(
                    "data",
                    format!("the file cannot be read: {e}"),
                )));
                return;
            }
        };
        batch.push(row);
        if batch.len() >= BATCH_ROWS
            && !send(Ok(std::mem::replace(
                &mut batch,
                Vec::with_capacity(BATCH_ROWS),
            )))
        {
            return;
        }
    }
    if !batch.is_empty() {
        send(Ok(batch));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn rows(text: &str) -> Result<Vec<ImportRow>, Error> {
        let sent = RefCell::new(Vec::new());
        parse(text.as_bytes(), &|b| {
            sent.borrow_mut().push(b);
            true
        });
        let mut rows = Vec::new();
        for batch in sent.into_inner() {
            rows.extend(batch?);
        }
        Ok(rows)
    }

    #[test]
    fn a_row_without_end_is_refused_instead_of_held_whole() {
        let unclosed = format!("recipient\n\"{}", "a".repeat(2 * MAX_ROW_BYTES));
        match rows(&unclosed) {
            Err(Error::InvalidArgument(v)) => {
                let text = format!("{v:?}");
                assert!(text.contains("longer than 1 MiB"), "{text}");
            }
            other => panic!("accepted: {:?}", other.map(|r| r.len())),
        }
        let header = "a".repeat(2 * MAX_ROW_BYTES);
        assert!(rows(&header).is_err(), "a header without end was read");
        // Rows of any count under the limit are read, however long the file.
        let many = format!("recipient\n{}", "+4915112345678\n".repeat(100_000));
        assert_eq!(rows(&many).map(|r| r.len()).ok(), Some(100_000));
    }

    #[test]
    fn columns_become_fields_and_attributes() -> Result<(), Error> {
        let rows = rows(
            "recipient,name,tags,birthday,team\n\
             +4915112345678, Ann ,vip; sales,1990-03-07,\n\
             \"+4915112345679\",\"Bo, Jr\",,,north\n",
        )?;
        let contacts: Vec<(i64, Contact)> = rows
            .into_iter()
            .map(|r| match r {
                ImportRow::Contact { line, contact } => (line, contact),
                ImportRow::Bad(e) => panic!("bad row {e:?}"),
            })
            .collect();
        assert_eq!(contacts[0].0, 2);
        assert_eq!(contacts[0].1.name, "Ann");
        assert_eq!(contacts[0].1.tags, vec!["vip", "sales"]);
        assert_eq!(
            contacts[0].1.attributes.get("birthday").map(String::as_str),
            Some("1990-03-07")
        );
        assert!(!contacts[0].1.attributes.contains_key("team"));
        assert_eq!(contacts[1].0, 3);
        assert_eq!(contacts[1].1.name, "Bo, Jr");
        assert_eq!(
            contacts[1].1.attributes.get("team").map(String::as_str),
            Some("north")
        );
        Ok(())
    }

    #[test]
    fn a_row_with_too_many_fields_is_reported_by_line() -> Result<(), Error> {
        let rows = rows("recipient,name\n+4915112345678,Ann\n+4915112345679,Bo,extra\n")?;
        assert!(matches!(&rows[1], ImportRow::Bad(e) if e.line == 3));
        Ok(())
    }

    #[test]
    fn a_header_without_recipient_is_refused() {
        let e = rows("phone,name\n+4915112345678,Ann\n").err();
        assert!(matches!(e, Some(Error::InvalidArgument(v)) if v[0].field == "data"));
    }
}
