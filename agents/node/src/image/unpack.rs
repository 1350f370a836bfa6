//! Applying a layer to a root filesystem: decompression (gzip, zstd, or none) and the OCI
//! whiteouts (`.wh.<name>` deletes a lower file, `.wh..wh..opq` hides a lower directory's
//! contents). Paths never leave the root: `tar`'s `unpack_in` refuses `..` and links out.

use std::collections::HashSet;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use super::digest::{Digest, HashingReader};

/// The opaque-directory marker.
const OPAQUE: &str = ".wh..wh..opq";
/// The prefix of a whiteout.
const WHITEOUT: &str = ".wh.";

/// A layer's compression, from its media type (or, failing that, its first bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// tar+gzip.
    Gzip,
    /// tar+zstd.
    Zstd,
}

impl Compression {
    /// From a layer media type; `None` for unknown types.
    pub fn of_media_type(mt: &str) -> Option<Compression> {
        if mt.ends_with("+gzip") || mt.ends_with(".tar.gzip") || mt.ends_with(".gzip") {
            Some(Compression::Gzip)
        } else if mt.ends_with("+zstd") || mt.ends_with(".zstd") {
            Some(Compression::Zstd)
        } else if mt.ends_with(".tar") || mt.ends_with(".rootfs.diff.tar") {
            Some(Compression::None)
        } else {
            None
        }
    }

    /// From the magic bytes.
    pub fn sniff(head: &[u8]) -> Compression {
        match head {
            [0x1f, 0x8b, ..] => Compression::Gzip,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
            _ => Compression::None,
        }
    }
}

/// Unpacks the layer in `blob` into `rootfs` and returns the digest of the uncompressed tar
/// (the layer's diff ID, which the caller checks against the config).
pub fn apply_layer(
    blob: &Path,
    compression: Option<Compression>,
    rootfs: &Path,
) -> io::Result<Digest> {
    let mut f = std::fs::File::open(blob)?;
    let compression = match compression {
        Some(c) => c,
        None => {
            let mut head = [0u8; 4];
            let n = f.read(&mut head)?;
            std::io::Seek::rewind(&mut f)?;
            Compression::sniff(&head[..n])
        }
    };
    let f = io::BufReader::new(f);
    let reader: Box<dyn Read> = match compression {
        Compression::None => Box::new(f),
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(f)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(f)?),
    };
    let mut hashing = HashingReader::new(reader);
    apply_tar(&mut hashing, rootfs)?;
    hashing.finish()
}

/// Applies an uncompressed layer tar to `rootfs`.
pub fn apply_tar(reader: &mut dyn Read, rootfs: &Path) -> io::Result<()> {
    std::fs::create_dir_all(rootfs)?;
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(nix::unistd::geteuid().is_root());
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    archive.set_unpack_xattrs(false);
    // What this layer itself created: an opaque marker hides only the lower layers' files.
    let mut created: HashSet<PathBuf> = HashSet::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = clean(&entry.path()?)?;
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        let parent = path.parent().unwrap_or(Path::new("")).to_path_buf();
        if name == OPAQUE {
            let dir = rootfs.join(&parent);
            if let Ok(rd) = std::fs::read_dir(&dir) {
                for child in rd.flatten() {
                    if !created.contains(&parent.join(child.file_name())) {
                        remove_any(&child.path())?;
                    }
                }
            }
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            let target = rootfs.join(&parent).join(hidden);
            if target.symlink_metadata().is_ok() {
                remove_any(&target)?;
            }
            continue;
        }
        let target = rootfs.join(&path);
        let is_dir = entry.header().entry_type().is_dir();
        if let Ok(m) = target.symlink_metadata() {
            // A file may replace a directory and the other way round.
            if m.is_dir() != is_dir || m.file_type().is_symlink() {
                remove_any(&target)?;
            }
        }
        if !entry.unpack_in(rootfs)? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("entry {} escapes the root", path.display()),
            ));
        }
        created.insert(path);
    }
    Ok(())
}

/// A tar path made relative and free of `.` and `..` (refused).
fn clean(p: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("entry {} escapes the root", p.display()),
                ))
            }
        }
    }
    Ok(out)
}

fn remove_any(p: &Path) -> io::Result<()> {
    match p.symlink_metadata() {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tar of `(path, Some(contents))` files and `(path, None)` directories.
    pub(crate) fn tar_of(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            match data {
                Some(d) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(d.len() as u64);
                    h.set_mode(0o755);
                    b.append_data(&mut h, path, *d).unwrap();
                }
                None => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    h.set_mode(0o755);
                    b.append_data(&mut h, path, &[][..]).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn apply(rootfs: &Path, layer: Vec<u8>, c: Compression) -> io::Result<Digest> {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), layer).unwrap();
        apply_layer(f.path(), Some(c), rootfs)
    }

    #[test]
    fn whiteouts_delete_lower_files_and_opaque_dirs_hide_lower_contents() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("rootfs");
        let lower = tar_of(&[
            ("etc/", None),
            ("etc/keep", Some(b"k")),
            ("etc/gone", Some(b"g")),
            ("data/", None),
            ("data/old", Some(b"o")),
        ]);
        apply(&root, gzip(&lower), Compression::Gzip).unwrap();
        let upper = tar_of(&[
            ("etc/.wh.gone", Some(b"")),
            ("data/", None),
            ("data/new", Some(b"n")),
            ("data/.wh..wh..opq", Some(b"")),
        ]);
        let zst = zstd::stream::encode_all(&upper[..], 3).unwrap();
        let diff_id = apply(&root, zst, Compression::Zstd).unwrap();
        assert_eq!(diff_id, Digest::of(&upper));
        assert!(root.join("etc/keep").exists());
        assert!(!root.join("etc/gone").exists());
        assert!(!root.join("etc/.wh.gone").exists());
        assert!(
            !root.join("data/old").exists(),
            "opaque dir hides the lower file"
        );
        assert_eq!(std::fs::read(root.join("data/new")).unwrap(), b"n");
        assert!(!root.join("data/.wh..wh..opq").exists());
    }

    #[test]
    fn a_file_replaces_a_lower_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("rootfs");
        apply(
            &root,
            tar_of(&[("x/", None), ("x/y", Some(b"1"))]),
            Compression::None,
        )
        .unwrap();
        apply(&root, tar_of(&[("x", Some(b"file"))]), Compression::None).unwrap();
        assert_eq!(std::fs::read(root.join("x")).unwrap(), b"file");
    }

    #[test]
    fn a_corrupted_layer_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mut gz = gzip(&tar_of(&[("a", Some(&[7u8; 4096][..]))]));
        let mid = gz.len() / 2;
        gz[mid] ^= 0xff;
        gz.truncate(gz.len() - 4);
        assert!(apply(&tmp.path().join("r"), gz, Compression::Gzip).is_err());
    }

    #[test]
    fn entries_that_climb_out_of_the_root_are_refused() {
        assert!(clean(Path::new("../etc/passwd")).is_err());
        assert_eq!(clean(Path::new("/./a/b")).unwrap(), PathBuf::from("a/b"));
    }

    #[test]
    fn compression_comes_from_the_media_type_or_the_magic() {
        assert_eq!(
            Compression::of_media_type("application/vnd.oci.image.layer.v1.tar+zstd"),
            Some(Compression::Zstd)
        );
        assert_eq!(
            Compression::of_media_type("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(
            Compression::of_media_type("application/vnd.oci.image.layer.v1.tar"),
            Some(Compression::None)
        );
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8]), Compression::Gzip);
        assert_eq!(Compression::sniff(b"ustar"), Compression::None);
    }
}
