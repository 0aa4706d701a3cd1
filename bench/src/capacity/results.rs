//! The results file of a capacity run: one JSON line per finished repetition of an
//! experiment, appended (and flushed to disk) as it finishes, so a killed run loses at most
//! the repetition in progress. A rerun reads it back and replays it into the search.
//!
//! The first line names the execution it belongs to (a fingerprint of the execution file):
//! results of a different execution are refused, never mixed in.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::goodput::Served;
use super::search::{Cell, Verdicts};

#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: not a result record: {source}")]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error(
        "{path} holds results of another execution (fingerprint {found}, this one is {expected}); \
         move it away or name another results file"
    )]
    OtherExecution {
        path: PathBuf,
        found: String,
        expected: String,
    },
}

/// The header line.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    execution: String,
}

/// One finished repetition of one experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The load value (e.g. LIST calls per minute) and its index in the load dimension.
    pub load: f64,
    pub load_index: usize,
    /// The resource value (e.g. quota bytes/s) and its index.
    pub resource: f64,
    pub resource_index: usize,
    pub repetition: u32,
    /// Whether every SLO held.
    pub ok: bool,
    /// Each SLO's measured value and verdict, for the reports.
    #[serde(default)]
    pub slos: Vec<SloOutcome>,
    /// What the run served: LISTs answered 2xx per minute and their bytes (none in records
    /// written before goodput was recorded).
    #[serde(flatten)]
    pub served: Option<Served>,
    /// Where the experiment's loadgen output is (relative to the results file).
    #[serde(default)]
    pub output: Option<String>,
    /// RFC 3339 start, and wall seconds.
    #[serde(default)]
    pub started: String,
    #[serde(default)]
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SloOutcome {
    pub name: String,
    /// The measured value (NaN is written as null).
    pub value: Option<f64>,
    pub limit: f64,
    pub ok: bool,
}

impl Record {
    pub fn cell(&self) -> Cell {
        Cell {
            load: self.load_index,
            resource: self.resource_index,
        }
    }
}

/// The results file, opened for appending.
#[derive(Debug)]
pub struct ResultsFile {
    path: PathBuf,
    file: File,
    records: Vec<Record>,
}

impl ResultsFile {
    /// Opens (or creates) the file for the execution with this fingerprint and reads what is in
    /// it. A torn last line (the run was killed while writing it) is dropped: that repetition
    /// will run again.
    pub fn open(path: &Path, fingerprint: &str) -> Result<Self, ResultsError> {
        let io = |source| ResultsError::Io {
            path: path.to_owned(),
            source,
        };
        let mut records = Vec::new();
        let mut header_seen = false;
        if path.exists() {
            let reader = BufReader::new(File::open(path).map_err(io)?);
            let lines: Vec<String> = reader.lines().collect::<Result<_, _>>().map_err(io)?;
            let last = lines.len();
            for (i, line) in lines.iter().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                if !header_seen {
                    let header: Header =
                        serde_json::from_str(line).map_err(|source| ResultsError::Parse {
                            path: path.to_owned(),
                            line: i + 1,
                            source,
                        })?;
                    if header.execution != fingerprint {
                        return Err(ResultsError::OtherExecution {
                            path: path.to_owned(),
                            found: header.execution,
                            expected: fingerprint.to_owned(),
                        });
                    }
                    header_seen = true;
                    continue;
                }
                match serde_json::from_str::<Record>(line) {
                    Ok(r) => records.push(r),
                    Err(e) if i + 1 == last => {
                        tracing::warn!(path = %path.display(), line = i + 1, error = %e,
                            "dropping a torn last record; that repetition runs again");
                    }
                    Err(source) => {
                        return Err(ResultsError::Parse {
                            path: path.to_owned(),
                            line: i + 1,
                            source,
                        })
                    }
                }
            }
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        if !header_seen {
            let header = Header {
                execution: fingerprint.to_owned(),
            };
            // A fresh file, or one whose only content was torn: start it over.
            file.set_len(0).map_err(io)?;
            write_line(&mut file, &header).map_err(io)?;
        } else {
            // Rewrite without a torn tail so the next append starts on its own line.
            let mut body = serde_json::to_string(&Header {
                execution: fingerprint.to_owned(),
            })
            .map_err(|e| io(e.into()))?;
            body.push('\n');
            for r in &records {
                body.push_str(&serde_json::to_string(r).map_err(|e| io(e.into()))?);
                body.push('\n');
            }
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, body).map_err(io)?;
            std::fs::rename(&tmp, path).map_err(io)?;
            file = OpenOptions::new().append(true).open(path).map_err(io)?;
        }
        Ok(ResultsFile {
            path: path.to_owned(),
            file,
            records,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Appends a record and flushes it to disk before returning.
    pub fn append(&mut self, record: Record) -> Result<(), ResultsError> {
        write_line(&mut self.file, &record).map_err(|source| ResultsError::Io {
            path: self.path.clone(),
            source,
        })?;
        self.records.push(record);
        Ok(())
    }

    /// Repetitions recorded per cell.
    pub fn repetitions(&self) -> BTreeMap<Cell, Vec<&Record>> {
        let mut by: BTreeMap<Cell, Vec<&Record>> = BTreeMap::new();
        for r in &self.records {
            by.entry(r.cell()).or_default().push(r);
        }
        by
    }

    /// What each experiment with all its repetitions recorded served at least (see
    /// [`Served::least`]); cells whose records predate goodput have none.
    pub fn served(&self, repetitions: u32) -> BTreeMap<Cell, Served> {
        self.repetitions()
            .into_iter()
            .filter(|(_, rs)| rs.len() >= repetitions as usize)
            .filter_map(|(cell, rs)| {
                let all: Option<Vec<Served>> = rs.iter().map(|r| r.served).collect();
                Some((cell, Served::least(all?)?))
            })
            .collect()
    }

    /// The verdict of every experiment with all its repetitions recorded: it passes when every
    /// repetition met every SLO (capacity planning wants the load that holds every time).
    pub fn verdicts(&self, repetitions: u32) -> Verdicts {
        self.repetitions()
            .into_iter()
            .filter(|(_, rs)| rs.len() >= repetitions as usize)
            .map(|(cell, rs)| (cell, rs.iter().all(|r| r.ok)))
            .collect()
    }
}

fn write_line<T: Serialize>(file: &mut File, value: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value)?;
    line.push(b'\n');
    file.write_all(&line)?;
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(load: usize, resource: usize, repetition: u32, ok: bool) -> Record {
        Record {
            load: load as f64 * 60.0,
            load_index: load,
            resource: resource as f64,
            resource_index: resource,
            repetition,
            ok,
            slos: vec![],
            served: None,
            output: None,
            started: String::new(),
            seconds: 1.0,
        }
    }

    #[test]
    fn appended_records_come_back_and_need_all_repetitions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        let mut f = ResultsFile::open(&path, "abc").unwrap();
        f.append(record(0, 0, 0, true)).unwrap();
        f.append(record(0, 0, 1, false)).unwrap();
        f.append(record(1, 0, 0, true)).unwrap();
        drop(f);
        let f = ResultsFile::open(&path, "abc").unwrap();
        assert_eq!(f.records().len(), 3);
        let v = f.verdicts(2);
        assert_eq!(
            v.get(&Cell {
                load: 0,
                resource: 0
            }),
            Some(&false)
        );
        assert_eq!(
            v.get(&Cell {
                load: 1,
                resource: 0
            }),
            None,
            "one of two repetitions is not a verdict"
        );
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_the_file_stays_appendable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        let mut f = ResultsFile::open(&path, "abc").unwrap();
        f.append(record(0, 0, 0, true)).unwrap();
        drop(f);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"load\": 60.0, \"loadInd");
        std::fs::write(&path, text).unwrap();
        let mut f = ResultsFile::open(&path, "abc").unwrap();
        assert_eq!(f.records().len(), 1);
        f.append(record(1, 0, 0, true)).unwrap();
        drop(f);
        assert_eq!(ResultsFile::open(&path, "abc").unwrap().records().len(), 2);
    }

    #[test]
    fn results_of_another_execution_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        drop(ResultsFile::open(&path, "abc").unwrap());
        let err = ResultsFile::open(&path, "xyz").unwrap_err().to_string();
        assert!(err.contains("another execution"), "{err}");
    }

    #[test]
    fn a_bad_line_in_the_middle_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        std::fs::write(
            &path,
            "{\"execution\":\"abc\"}\nnot json\n{\"execution\":\"abc\"}\n",
        )
        .unwrap();
        let err = ResultsFile::open(&path, "abc").unwrap_err().to_string();
        assert!(err.contains(":2:"), "{err}");
    }
}
