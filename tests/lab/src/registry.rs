//! An OCI registry for the lab: Debian's `docker-registry` (distribution 2.8), serving TLS
//! with a certificate from the lab CA, optionally behind htpasswd basic auth.
//!
//! It listens on a free loopback port (where the test process pushes) and the hub relays
//! [`REGISTRY_HUB_PORT`] on the hub address to it, so machines pull from
//! `10.213.0.1:5000` like any other lab service. [`Registry::stop`] and
//! [`Registry::start_again`] take it down and bring it back with its content.
//!
//! [`Registry::push`] uploads a small image (files from the host, one gzip layer, an OCI
//! manifest under a tag) over the distribution API, so tests need no image tooling.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::error::{LabError, Result};
use crate::pki::Ca;
use crate::process::Daemon;

/// The port the hub relays to the registry.
pub const REGISTRY_HUB_PORT: u16 = 5000;

/// How the lab's registry is set up.
#[derive(Clone, Debug, Default)]
pub struct RegistryConfig {
    /// Require this user and password (htpasswd, bcrypt). `None`: anonymous pulls and pushes.
    pub basic_auth: Option<(String, String)>,
}

/// A running registry.
#[derive(Debug)]
pub struct Registry {
    daemon: Daemon,
    dir: PathBuf,
    local: SocketAddr,
    basic_auth: Option<(String, String)>,
    http: reqwest::Client,
    rt: tokio::runtime::Handle,
}

/// A file to put into a pushed image.
#[derive(Clone, Debug)]
pub struct ImageFile {
    /// Path inside the image (relative, e.g. `bin/busybox`).
    pub path: String,
    /// The file on the host to copy.
    pub source: PathBuf,
    /// Mode bits.
    pub mode: u32,
}

impl Registry {
    /// Starts `docker-registry` in `dir` and waits until it answers `/v2/`.
    pub(crate) fn start(
        dir: &Path,
        lab_id: &str,
        ca: &Ca,
        config: &RegistryConfig,
        rt: tokio::runtime::Handle,
    ) -> Result<Registry> {
        crate::require_tool("docker-registry")?;
        std::fs::create_dir_all(dir.join("data")).map_err(LabError::io(dir))?;
        let hub = crate::netns::HUB_ADDR.to_string();
        let cert = ca.issue_server_cert(&[&hub, "127.0.0.1", "localhost"])?;
        let (crt, key) = cert.write(dir, "registry")?;
        let ca_path = dir.join("ca.crt");
        std::fs::write(&ca_path, ca.cert_pem()).map_err(LabError::io(&ca_path))?;
        let port = crate::ports::free_port();
        let local = SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port);
        let auth = match &config.basic_auth {
            Some((user, password)) => {
                let hash = bcrypt::hash(password, 5)
                    .map_err(|e| LabError::Other(format!("htpasswd: {e}")))?;
                let path = dir.join("htpasswd");
                crate::write_secret(&path, format!("{user}:{hash}\n").as_bytes())?;
                format!(
                    "auth:\n  htpasswd:\n    realm: palisade-lab\n    path: {}\n",
                    path.display()
                )
            }
            None => String::new(),
        };
        let yaml = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {data}\n  delete:\n    enabled: true\nhttp:\n  addr: {local}\n  tls:\n    certificate: {crt}\n    key: {key}\n{auth}",
            data = dir.join("data").display(),
            crt = crt.display(),
            key = key.display(),
        );
        let cfg = dir.join("config.yml");
        std::fs::write(&cfg, yaml).map_err(LabError::io(&cfg))?;
        let mut cmd = Command::new("docker-registry");
        cmd.arg("serve").arg(&cfg);
        let daemon = Daemon::spawn("docker-registry", cmd, lab_id, &dir.join("registry.log"))?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(crate::control_plane::tls_config(
                ca.cert_pem().as_bytes(),
                None,
            )?)
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| LabError::Other(format!("registry client: {e}")))?;
        let mut reg = Registry {
            daemon,
            dir: dir.to_path_buf(),
            local,
            basic_auth: config.basic_auth.clone(),
            http,
            rt,
        };
        reg.wait_ready()?;
        Ok(reg)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let (http, url) = (self.http.clone(), format!("https://{}/v2/", self.local));
        let rt = self.rt.clone();
        self.daemon.wait_ready(Duration::from_secs(30), || {
            let (http, url) = (http.clone(), url.clone());
            // 401 means up, behind auth.
            crate::block(&rt, async move { http.get(&url).send().await })
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }

    /// Where machines reach it: `10.213.0.1:5000`.
    pub fn host(&self) -> String {
        format!("{}:{REGISTRY_HUB_PORT}", crate::netns::HUB_ADDR)
    }

    /// Where the test process reaches it (loopback).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The lab CA's certificate, which the registry's certificate chains to.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// Takes the registry down (its content stays on disk).
    pub fn stop(&mut self) {
        self.daemon.stop(Duration::from_secs(5));
    }

    /// Brings it back after [`Registry::stop`] and waits until it answers.
    pub fn start_again(&mut self) -> Result<()> {
        self.daemon.restart(Duration::from_secs(5))?;
        self.wait_ready()
    }

    /// Pushes `repository:tag` holding `bin`, stripped, at `/<its file name>` as the
    /// entrypoint, and the shared libraries it loads, nothing else ([`binary_image_files`]):
    /// the layout `hack/images.sh` builds. Returns the manifest digest.
    pub fn push_binary(
        &self,
        work_dir: &Path,
        repository: &str,
        tag: &str,
        bin: &Path,
    ) -> Result<String> {
        let (files, entry) = binary_image_files(work_dir, bin)?;
        self.push(repository, tag, &files, &[entry.as_str()])
    }

    /// Pushes an image of `files` (one gzip layer) running `entrypoint` as
    /// `<repository>:<tag>`; returns the manifest digest (`sha256:…`).
    pub fn push(
        &self,
        repository: &str,
        tag: &str,
        files: &[ImageFile],
        entrypoint: &[&str],
    ) -> Result<String> {
        let layer_tar = layer(files)?;
        let diff_id = digest(&layer_tar);
        let gz = {
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&layer_tar)
                .map_err(|e| LabError::Other(format!("gzip: {e}")))?;
            e.finish()
                .map_err(|e| LabError::Other(format!("gzip: {e}")))?
        };
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }))
        .map_err(|e| LabError::Other(e.to_string()))?;
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(&config), "size": config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(&gz), "size": gz.len()}],
        }))
        .map_err(|e| LabError::Other(e.to_string()))?;
        let base = format!("https://{}/v2/{repository}", self.local);
        let (http, auth) = (self.http.clone(), self.basic_auth.clone());
        let manifest_digest = digest(&manifest);
        let manifest_url = format!("{base}/manifests/{tag}");
        crate::block(&self.rt, async move {
            let with_auth = |b: reqwest::RequestBuilder| match &auth {
                Some((u, p)) => b.basic_auth(u, Some(p)),
                None => b,
            };
            for blob in [config, gz] {
                let r = with_auth(http.post(format!("{base}/blobs/uploads/")))
                    .send()
                    .await?;
                let r = r.error_for_status()?;
                let loc = r
                    .headers()
                    .get("location")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let loc = if loc.starts_with("http") {
                    loc
                } else {
                    format!(
                        "https://{}{loc}",
                        base.trim_start_matches("https://")
                            .split('/')
                            .next()
                            .unwrap_or_default()
                    )
                };
                let sep = if loc.contains('?') { '&' } else { '?' };
                let url = format!("{loc}{sep}digest={}", digest(&blob));
                with_auth(http.put(url))
                    .header("content-type", "application/octet-stream")
                    .body(blob)
                    .send()
                    .await?
                    .error_for_status()?;
            }
            with_auth(http.put(manifest_url))
                .header("content-type", "application/vnd.oci.image.manifest.v1+json")
                .body(manifest)
                .send()
                .await?
                .error_for_status()?;
            Ok::<_, reqwest::Error>(())
        })
        .map_err(|e| LabError::Other(format!("push {repository}:{tag}: {e}")))?;
        Ok(manifest_digest)
    }
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A tar of `files` with their parent directories.
fn layer(files: &[ImageFile]) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    for f in files {
        let mut p = Path::new(&f.path).parent();
        let mut chain = Vec::new();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            chain.push(d.to_path_buf());
            p = d.parent();
        }
        for d in chain.into_iter().rev() {
            if dirs.insert(d.clone()) {
                let mut h = tar::Header::new_gnu();
                h.set_uid(0);
                h.set_gid(0);
                h.set_mtime(0);
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, &d, &[][..])
                    .map_err(|e| LabError::Other(format!("layer: {e}")))?;
            }
        }
        let data = std::fs::read(&f.source).map_err(LabError::io(&f.source))?;
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(f.mode);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, &f.path, &data[..])
            .map_err(|e| LabError::Other(format!("layer: {e}")))?;
    }
    b.into_inner()
        .map_err(|e| LabError::Other(format!("layer: {e}")))
}

/// The files of an image holding only `bin`, stripped (the copy is written in `work_dir`), at
/// `/<its file name>`, and the shared libraries it loads (as `ldd` lists them); and the
/// entrypoint, `/<its file name>`.
pub fn binary_image_files(work_dir: &Path, bin: &Path) -> Result<(Vec<ImageFile>, String)> {
    let name = bin
        .file_name()
        .ok_or_else(|| LabError::Other(format!("{} has no file name", bin.display())))?
        .to_string_lossy()
        .into_owned();
    let stripped = work_dir.join(format!("image-{name}"));
    let ok = std::process::Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(bin)
        .status()
        .map_err(LabError::io(bin))?;
    if !ok.success() {
        return Err(LabError::Other(format!("strip {} failed", bin.display())));
    }
    let ldd = std::process::Command::new("ldd")
        .arg(bin)
        .output()
        .map_err(LabError::io(bin))?;
    if !ldd.status.success() {
        return Err(LabError::Other(format!("ldd {} failed", bin.display())));
    }
    let mut files = vec![ImageFile {
        path: name.clone(),
        source: stripped,
        mode: 0o755,
    }];
    for lib in String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
    {
        files.push(ImageFile {
            path: lib.trim_start_matches('/').to_string(),
            source: lib.into(),
            mode: 0o755,
        });
    }
    Ok((files, format!("/{name}")))
}
