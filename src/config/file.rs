//! Reading a file the configuration names (the routing file, API key and
//! JWKS files, TLS certificates and keys, secrets and sealing keys): it must
//! be a regular file once symlinks are followed (a Kubernetes secret is a
//! symlink to one), and it is read up to a cap per kind of file. A FIFO, a
//! device such as `/dev/zero`, a directory or a file over its cap is an
//! error naming the path, never a hang or an allocation the size of what
//! the file claims to hold.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// What a file is for; each kind has its cap (README, "Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The routing file itself.
    Routing,
    /// An `api_key` policy's `keys_file`.
    ApiKeys,
    /// A `jwt` policy's `jwks_file`.
    Jwks,
    /// A PEM certificate chain, private key or CA bundle.
    Tls,
    /// One secret: a sealing key, the cluster secret, an HS256 secret, an
    /// upstream header's `value_file`.
    Secret,
}

impl Kind {
    /// The most bytes a file of this kind may hold.
    pub const fn cap(self) -> u64 {
        match self {
            Kind::Routing => 16 << 20,
            // 100,000 keys (`super::keys::MAX_KEYS`) of a 128-byte id and a
            // 64-digit digest, with about 140 bytes per line to spare for
            // groups and comments.
            Kind::ApiKeys => 32 << 20,
            // As much as a `jwks_url` answer may be.
            Kind::Jwks => 1 << 20,
            // A chain or a CA bundle (the whole Mozilla bundle is ~220 KiB).
            Kind::Tls => 1 << 20,
            Kind::Secret => 64 << 10,
        }
    }
}

/// Why a named file could not be had (never anything it holds).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: not a regular file ({what})", path.display())]
    NotRegular { path: PathBuf, what: &'static str },
    #[error("{}: larger than {cap} bytes, the most a file of this kind may hold", path.display())]
    TooLarge { path: PathBuf, cap: u64 },
    #[error("{}: not UTF-8 text", path.display())]
    NotUtf8 { path: PathBuf },
}

/// The bytes of the regular file at `path`, at most `kind`'s cap.
pub fn read(path: &Path, kind: Kind) -> Result<Vec<u8>, FileError> {
    let io = |source| FileError::Io { path: path.into(), source };
    let file = open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    regular(path, &meta)?;
    let cap = kind.cap();
    if meta.len() > cap {
        return Err(FileError::TooLarge { path: path.into(), cap });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // One byte past the cap tells a file that grew since `metadata`.
    file.take(cap + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > cap {
        return Err(FileError::TooLarge { path: path.into(), cap });
    }
    Ok(bytes)
}

/// [`read`], as text.
pub fn read_to_string(path: &Path, kind: Kind) -> Result<String, FileError> {
    String::from_utf8(read(path, kind)?).map_err(|_| FileError::NotUtf8 { path: path.into() })
}

/// Whether `path` is there and a regular file, without opening it (what
/// `check-config` lists before the file's user reads it).
pub fn check(path: &Path) -> Result<(), FileError> {
    let meta = std::fs::metadata(path).map_err(|source| FileError::Io { path: path.into(), source })?;
    regular(path, &meta)
}

/// Opens for reading without waiting: a FIFO opened for reading blocks
/// until a writer comes, unless non-blocking (its type is refused next).
fn open(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    options.open(path)
}

fn regular(path: &Path, meta: &std::fs::Metadata) -> Result<(), FileError> {
    if meta.is_file() {
        return Ok(());
    }
    Err(FileError::NotRegular { path: path.into(), what: type_name(meta.file_type()) })
}

fn type_name(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "another kind of file"
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sessionless-unit-file-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_regular_file_is_read_through_a_symlink() {
        let d = dir("symlink");
        let (file, link) = (d.join("data"), d.join("link"));
        std::fs::write(&file, "secret").unwrap();
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_to_string(&link, Kind::Secret).unwrap(), "secret");
        check(&link).unwrap();
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn a_fifo_a_device_and_a_directory_are_refused_at_once() {
        let d = dir("kinds");
        let fifo = d.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        // No writer ever comes: a blocking open would wait forever.
        let err = read(&fifo, Kind::ApiKeys).unwrap_err().to_string();
        assert!(err.contains("a FIFO"), "{err}");
        let err = read(Path::new("/dev/zero"), Kind::ApiKeys).unwrap_err().to_string();
        assert!(err.contains("/dev/zero: not a regular file (a device)"), "{err}");
        assert!(read(&d, Kind::Tls).unwrap_err().to_string().contains("a directory"));
        for path in [fifo.as_path(), Path::new("/dev/zero"), d.as_path()] {
            assert!(matches!(check(path), Err(FileError::NotRegular { .. })), "{}", path.display());
        }
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn a_file_over_its_cap_is_refused_and_one_at_it_is_read() {
        let d = dir("cap");
        let path = d.join("secret");
        let cap = Kind::Secret.cap() as usize;
        std::fs::write(&path, vec![b'a'; cap]).unwrap();
        assert_eq!(read(&path, Kind::Secret).unwrap().len(), cap);
        std::fs::write(&path, vec![b'a'; cap + 1]).unwrap();
        let err = read(&path, Kind::Secret).unwrap_err().to_string();
        assert!(err.contains(&format!("larger than {cap} bytes")), "{err}");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(matches!(read_to_string(&path, Kind::Secret), Err(FileError::NotUtf8 { .. })));
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn the_key_file_cap_fits_the_most_keys_with_the_longest_ids() {
        // `<id> <sha256 hex> <groups>`, the longest id.
        let line = format!("{} {} ops,admin,readers\n", "k".repeat(128), "0".repeat(64));
        let most = crate::config::keys::MAX_KEYS as u64 * line.len() as u64;
        assert!(most <= Kind::ApiKeys.cap(), "{most} bytes");
    }
}
