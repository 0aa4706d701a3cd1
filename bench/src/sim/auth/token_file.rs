//! kube-apiserver's `--token-auth-file`: static bearer tokens in CSV
//! (`token,user,uid[,"group1,group2"]`), read once, with errors that name the
//! file and the line.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};

use super::user::UserInfo;

/// The users of a `--token-auth-file`, by token.
pub(crate) struct TokenFile {
    users: HashMap<String, UserInfo>,
}

/// A `--token-auth-file` that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("reading token file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("token file {}, line {line}: {reason}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

impl TokenFile {
    pub(crate) fn read(path: &Path) -> Result<Self, TokenFileError> {
        let contents = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&contents, path)
    }

    /// kube-apiserver's format: CSV records `token,user,uid[,"group1,group2"]`, extra columns
    /// ignored; blank lines skipped; a record with an empty token is skipped and a repeated
    /// token replaces the earlier one (both with a warning, as kube-apiserver does).
    pub(crate) fn parse(contents: &str, path: &Path) -> Result<Self, TokenFileError> {
        let mut users = HashMap::new();
        for (index, line) in contents.lines().enumerate() {
            let err = |reason: String| TokenFileError::Line {
                path: path.to_path_buf(),
                line: index + 1,
                reason,
            };
            if line.trim().is_empty() {
                continue;
            }
            let fields = csv_fields(line).map_err(err)?;
            let [token, name, uid, rest @ ..] = fields.as_slice() else {
                let found = fields.len();
                let reason =
                    format!("need at least 3 columns (token, user name, user uid), found {found}");
                return Err(err(reason));
            };
            if token.is_empty() {
                tracing::warn!(path = %path.display(), line = index + 1, "empty token skipped");
                continue;
            }
            let groups = rest.first().map(|g| g.split(',').filter(|g| !g.is_empty()));
            let user = UserInfo {
                name: name.clone(),
                uid: uid.clone(),
                groups: groups.into_iter().flatten().map(str::to_owned).collect(),
                extra: BTreeMap::new(),
            };
            if users.insert(token.clone(), user).is_some() {
                tracing::warn!(path = %path.display(), line = index + 1, "duplicate token");
            }
        }
        Ok(Self { users })
    }

    pub(crate) fn get(&self, token: &str) -> Option<&UserInfo> {
        self.users.get(token)
    }

    pub(crate) fn len(&self) -> usize {
        self.users.len()
    }
}

/// Splits one CSV line (RFC 4180 quoting, leading blanks of a field ignored, like Go's
/// `encoding/csv` with `TrimLeadingSpace`).
fn csv_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut field = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next() {
                    None => return Err("a quoted field is not closed".into()),
                    Some('"') if chars.next_if_eq(&'"').is_some() => field.push('"'),
                    Some('"') => break,
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
            match chars.next() {
                None => return Ok(fields),
                Some(',') => continue,
                Some(c) => return Err(format!("unexpected {c:?} after a closing quote")),
            }
        }
        loop {
            match chars.next() {
                None => {
                    fields.push(field);
                    return Ok(fields);
                }
                Some(',') => break,
                Some('"') => return Err("a quote inside an unquoted field".into()),
                Some(c) => field.push(c),
            }
        }
        fields.push(field);
    }
}
