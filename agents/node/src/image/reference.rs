//! Image references as the kubelet and containerd normalise them: `busybox` is
//! `docker.io/library/busybox:latest`; a first component with a `.` or `:` (or `localhost`)
//! names the registry; `@sha256:…` pins the content.

use super::digest::Digest;

/// The registry of references that name none.
pub const DEFAULT_REGISTRY: &str = "docker.io";

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// Registry host (and port), e.g. `10.213.0.1:5000`.
    pub registry: String,
    /// Repository path, e.g. `palisade/writer`.
    pub repository: String,
    /// Tag; `latest` when neither a tag nor a digest is given.
    pub tag: Option<String>,
    /// Pinned digest.
    pub digest: Option<Digest>,
}

impl Reference {
    /// Parses and normalises `image`; the error says what is wrong with it.
    pub fn parse(image: &str) -> Result<Reference, String> {
        if image.is_empty() {
            return Err("empty image name".into());
        }
        if image.len() > 255 + 128 + 72 || image.chars().any(char::is_whitespace) {
            return Err("too long or contains whitespace".into());
        }
        let (name, digest) = match image.split_once('@') {
            Some((n, d)) => (
                n,
                Some(Digest::parse(d).ok_or_else(|| format!("bad digest {d:?} (only sha256)"))?),
            ),
            None => (image, None),
        };
        let (name, tag) = match name.rfind(':') {
            Some(i) if !name[i..].contains('/') => (&name[..i], Some(name[i + 1..].to_string())),
            _ => (name, None),
        };
        if let Some(t) = &tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && !t.starts_with(['.', '-'])
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !ok {
                return Err(format!("bad tag {t:?}"));
            }
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => {
                (first.to_string(), rest.to_string())
            }
            Some(_) => (DEFAULT_REGISTRY.to_string(), name.to_string()),
            None => (DEFAULT_REGISTRY.to_string(), format!("library/{name}")),
        };
        if registry.is_empty()
            || !registry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        {
            return Err(format!("bad registry {registry:?}"));
        }
        for part in repository.split('/') {
            let ok = !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && part.starts_with(|c: char| c.is_ascii_alphanumeric())
                && part.ends_with(|c: char| c.is_ascii_alphanumeric());
            if !ok {
                return Err(format!(
                    "bad repository {repository:?}: path components are lowercase letters, digits and separators"
                ));
            }
        }
        let tag = match (&tag, &digest) {
            (None, None) => Some("latest".to_string()),
            _ => tag,
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What to ask the registry for: the digest when pinned, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }

    /// The host the distribution API is served from (Docker Hub's differs from its name).
    pub fn api_host(&self) -> &str {
        if self.registry == DEFAULT_REGISTRY {
            "registry-1.docker.io"
        } else {
            &self.registry
        }
    }

    /// `registry/repository@digest`: the form the kubelet reports as a container's `imageID`.
    pub fn with_digest(&self, digest: &Digest) -> String {
        format!("{}/{}@{digest}", self.registry, self.repository)
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn references_normalise_as_the_kubelet_does() {
        let table = [
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("org/app", "docker.io/org/app:latest"),
            (
                "docker.io/library/busybox",
                "docker.io/library/busybox:latest",
            ),
            (
                "10.213.0.1:5000/palisade/writer:v1",
                "10.213.0.1:5000/palisade/writer:v1",
            ),
            ("localhost/app", "localhost/app:latest"),
            ("localhost:5000/app:1", "localhost:5000/app:1"),
            (
                "registry.example/a/b/c:x_y.z-1",
                "registry.example/a/b/c:x_y.z-1",
            ),
            (
                &format!("reg.example/app@{D}"),
                &format!("reg.example/app@{D}"),
            ),
            (
                &format!("reg.example/app:v2@{D}"),
                &format!("reg.example/app:v2@{D}"),
            ),
        ];
        for (input, want) in table {
            let r = Reference::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(r.to_string(), *want, "{input}");
        }
    }

    #[test]
    fn malformed_references_are_refused_with_a_reason() {
        for bad in [
            "",
            "Upper/case",
            "reg.example/app:",
            "reg.example/app:-tag",
            "reg.example//app",
            "reg.example/app@sha256:short",
            "reg.example/app@md5:00",
            "app with space",
            "reg.example/app_/x",
            "reg.example/app:t@g",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn the_manifest_is_asked_for_by_digest_when_pinned() {
        let r = Reference::parse(&format!("reg.example/app:v2@{D}")).unwrap();
        assert_eq!(r.manifest_reference(), D);
        assert_eq!(
            Reference::parse("reg.example/app")
                .unwrap()
                .manifest_reference(),
            "latest"
        );
        assert_eq!(
            Reference::parse("busybox").unwrap().api_host(),
            "registry-1.docker.io"
        );
        assert_eq!(
            r.with_digest(r.digest.as_ref().unwrap()),
            format!("reg.example/app@{D}")
        );
    }
}
