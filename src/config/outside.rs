//! What a routing file names outside itself: environment variables and files
//! (sealing keys, the cluster secret, TLS files, API key files, JWKS files,
//! HS256 secrets). Validation asks for each of them here, so the file is
//! checked by one code path whether they are there or not: the gateway
//! (`Outside::required`) fails on the first one missing, `check-config`
//! (`Outside::optional`) lists them and checks the file without them. What
//! is present is checked in both cases; no value is ever printed. Files
//! are read by `super::file`: regular files only, each kind up to its cap.

use std::cell::RefCell;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::file::{self, Kind};

/// Where a value the file names comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    Env(String),
    File(PathBuf),
}

impl Source {
    /// The value (a file read as `kind`), or why it cannot be had (never
    /// the value itself).
    pub fn read(&self, kind: Kind) -> Result<String, String> {
        match self {
            Source::Env(name) => match std::env::var(name) {
                Ok(v) if !v.is_empty() => Ok(v),
                Ok(_) => Err(format!("environment variable {name} is empty")),
                Err(_) => Err(format!("environment variable {name} is not set")),
            },
            Source::File(path) => file::read_to_string(path, kind).map_err(|e| e.to_string()),
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Env(name) => write!(f, "${name}"),
            Source::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// One thing the config needs at run time, and whether this machine has it.
#[derive(Debug, Clone)]
pub struct Need {
    /// What it is for, e.g. "sealing key `2026-11`".
    pub what: String,
    pub source: Source,
    /// Not needed when the file or another variable gives the value.
    pub optional: bool,
    /// `None` when present; otherwise why not (no value in it).
    pub missing: Option<String>,
}

/// Reads what the file names, recording each need.
pub struct Outside {
    required: bool,
    needs: RefCell<Vec<Need>>,
    /// What `needs` holds already (a file of many upstreams names one per header).
    recorded: RefCell<HashSet<(String, Source)>>,
}

impl Outside {
    /// For running the gateway: anything missing is an error.
    pub fn required() -> Outside {
        Outside { required: true, needs: RefCell::default(), recorded: RefCell::default() }
    }

    /// For `check-config`: anything missing is listed, not an error.
    pub fn optional() -> Outside {
        Outside { required: false, needs: RefCell::default(), recorded: RefCell::default() }
    }

    /// Reads `source` (a file read as `kind`) for `what`: `Ok(None)` when
    /// it is missing and not required; the error names it, never its value.
    pub fn read(&self, what: &str, source: Source, kind: Kind) -> Result<Option<String>, String> {
        let value = source.read(kind);
        let missing = value.as_ref().err().cloned();
        self.record(what, source, false, missing.clone());
        match value {
            Ok(v) => Ok(Some(v)),
            Err(why) if self.required => Err(why),
            Err(_) => Ok(None),
        }
    }

    /// Whether a regular file is at `path` (it is read by its user).
    pub fn file(&self, what: &str, path: &str) -> Result<bool, String> {
        let missing = file::check(Path::new(path)).err().map(|e| e.to_string());
        let present = missing.is_none();
        self.record(what, Source::File(path.into()), false, missing.clone());
        match missing {
            Some(why) if self.required => Err(why),
            _ => Ok(present),
        }
    }

    /// A variable that gives a default (never an error when missing).
    pub fn default_from(&self, what: &str, var: &str) -> Option<String> {
        let value = std::env::var(var).ok().filter(|v| !v.is_empty());
        let missing = value.is_none().then(|| format!("environment variable {var} is not set"));
        self.record(what, Source::Env(var.into()), true, missing);
        value
    }

    /// Whether missing values are errors (then every value read is there).
    pub fn is_required(&self) -> bool {
        self.required
    }

    pub fn into_needs(self) -> Vec<Need> {
        self.needs.into_inner()
    }

    fn record(&self, what: &str, source: Source, optional: bool, missing: Option<String>) {
        if self.recorded.borrow_mut().insert((what.to_string(), source.clone())) {
            self.needs.borrow_mut().push(Need { what: what.to_string(), source, optional, missing });
        }
    }
}
