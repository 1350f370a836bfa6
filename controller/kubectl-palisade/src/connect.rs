//! Which API server, as whom: kubectl's connection flags (`--kubeconfig`, `--context`,
//! `--cluster`, `--user`) and its `KUBECONFIG` list of files, merged as kubectl merges them
//! (the first file to set a key wins).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The global connection flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Connection {
    /// Path to the kubeconfig file (default: the files listed in $KUBECONFIG, merged; then
    /// ~/.kube/config; then the in-cluster service account).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The kubeconfig cluster to use (default: the context's).
    #[arg(long, global = true, value_name = "NAME")]
    pub cluster: Option<String>,
    /// The kubeconfig user to use (default: the context's).
    #[arg(long, global = true, value_name = "NAME")]
    pub user: Option<String>,
}

impl Connection {
    fn options(&self) -> KubeConfigOptions {
        KubeConfigOptions {
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
        }
    }

    fn names_any(&self) -> bool {
        self.context.is_some() || self.cluster.is_some() || self.user.is_some()
    }
}

/// Where the kubeconfig comes from, in kubectl's order of precedence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `--kubeconfig FILE`: that file, which must exist.
    Flag(PathBuf),
    /// `KUBECONFIG=a:b:c`: these files merged, first wins; missing ones are skipped.
    List(Vec<PathBuf>),
    /// `~/.kube/config`, or the in-cluster service account when it does not exist.
    Default(Option<PathBuf>),
}

/// The kubeconfig source for this flag, `KUBECONFIG` value and home directory.
pub fn source(flag: Option<&Path>, env: Option<&OsStr>, home: Option<&Path>) -> Source {
    if let Some(path) = flag {
        return Source::Flag(path.to_path_buf());
    }
    let list: Vec<PathBuf> = env
        .map(|v| {
            std::env::split_paths(v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    if !list.is_empty() {
        return Source::List(list);
    }
    Source::Default(home.map(|h| h.join(".kube").join("config")))
}

/// Merges the files of a `KUBECONFIG` list that exist, in order (first to set a key wins).
pub fn merge_list(paths: &[PathBuf]) -> anyhow::Result<Kubeconfig> {
    let present: Vec<&PathBuf> = paths.iter().filter(|p| p.exists()).collect();
    if present.is_empty() {
        anyhow::bail!(
            "none of the files in KUBECONFIG exists: {}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    present
        .into_iter()
        .try_fold(Kubeconfig::default(), |merged, p| {
            let next = Kubeconfig::read_from(p)
                .with_context(|| format!("reading kubeconfig {}", p.display()))?;
            merged
                .merge(next)
                .with_context(|| format!("merging kubeconfig {}", p.display()))
        })
}

/// Checks that the context, cluster and user named (or implied by the current-context) exist,
/// so a typo is an error rather than an anonymous connection (kube, like client-go, falls back
/// to no credentials for an unknown user).
pub fn check_names(kc: &Kubeconfig, conn: &Connection) -> anyhow::Result<()> {
    let names = |list: Vec<&String>| {
        if list.is_empty() {
            "none".to_string()
        } else {
            list.into_iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let contexts = || names(kc.contexts.iter().map(|c| &c.name).collect());
    let context_name = match (&conn.context, &kc.current_context) {
        (Some(c), _) => c,
        (None, Some(c)) if !c.is_empty() => c,
        (None, _) => anyhow::bail!(
            "the kubeconfig sets no current-context: pass --context (contexts: {})",
            contexts()
        ),
    };
    let Some(context) = kc
        .contexts
        .iter()
        .find(|c| &c.name == context_name)
        .and_then(|c| c.context.as_ref())
    else {
        anyhow::bail!(
            "no context {context_name:?} in the kubeconfig (contexts: {})",
            contexts()
        );
    };
    let cluster = conn.cluster.as_ref().unwrap_or(&context.cluster);
    if !kc.clusters.iter().any(|c| &c.name == cluster) {
        anyhow::bail!(
            "no cluster {cluster:?} in the kubeconfig (clusters: {})",
            names(kc.clusters.iter().map(|c| &c.name).collect())
        );
    }
    if let Some(user) = conn.user.as_ref().or(context.user.as_ref()) {
        if !kc.auth_infos.iter().any(|u| &u.name == user) {
            anyhow::bail!(
                "no user {user:?} in the kubeconfig (users: {})",
                names(kc.auth_infos.iter().map(|u| &u.name).collect())
            );
        }
    }
    Ok(())
}

/// The API client for these flags and this environment.
pub async fn client(conn: &Connection) -> anyhow::Result<kube::Client> {
    let env = std::env::var_os("KUBECONFIG");
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let kc = match source(conn.kubeconfig.as_deref(), env.as_deref(), home.as_deref()) {
        Source::Flag(path) => Kubeconfig::read_from(&path)
            .with_context(|| format!("reading kubeconfig {}", path.display()))?,
        Source::List(paths) => merge_list(&paths)?,
        Source::Default(Some(path)) if path.exists() => Kubeconfig::read_from(&path)
            .with_context(|| format!("reading kubeconfig {}", path.display()))?,
        Source::Default(_) if conn.names_any() => anyhow::bail!(
            "--context, --cluster and --user need a kubeconfig: none found (set KUBECONFIG or --kubeconfig)"
        ),
        Source::Default(_) => {
            let config = kube::Config::incluster().context(
                "no kubeconfig found (set KUBECONFIG or --kubeconfig), and not in a cluster",
            )?;
            return kube::Client::try_from(config).context("building the API client");
        }
    };
    check_names(&kc, conn)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &conn.options())
        .await
        .context("loading the kubeconfig")?;
    kube::Client::try_from(config).context("building the API client")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(text: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(text).unwrap()
    }

    const LAB: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: https://127.0.0.1:1\nusers:\n- name: admin\n  user:\n    token: t\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: admin\n    namespace: kp\ncurrent-context: lab\n";

    #[test]
    fn the_flag_wins_over_the_kubeconfig_list_and_the_home_default() {
        let env = OsStr::new("/a:/b");
        assert_eq!(
            source(Some(Path::new("/f")), Some(env), Some(Path::new("/h"))),
            Source::Flag("/f".into())
        );
        assert_eq!(
            source(None, Some(env), Some(Path::new("/h"))),
            Source::List(vec!["/a".into(), "/b".into()])
        );
        assert_eq!(
            source(None, Some(OsStr::new("::")), Some(Path::new("/h"))),
            Source::Default(Some("/h/.kube/config".into())),
            "empty entries are ignored"
        );
        assert_eq!(source(None, None, None), Source::Default(None));
    }

    #[test]
    fn a_kubeconfig_list_is_merged_first_file_wins_and_missing_files_are_skipped() {
        let dir = std::env::temp_dir().join(format!("kp-connect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = dir.join("first");
        let second = dir.join("second");
        std::fs::write(
            &first,
            "apiVersion: v1\nkind: Config\ncontexts:\n- name: other\n  context:\n    cluster: lab\n    user: admin\n    namespace: first\ncurrent-context: other\n",
        )
        .unwrap();
        std::fs::write(
            &second,
            LAB.replace("current-context: lab", "current-context: ignored"),
        )
        .unwrap();
        let kc = merge_list(&[first.clone(), dir.join("missing"), second.clone()]).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("other"));
        let names: Vec<&str> = kc.contexts.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["other", "lab"]);
        assert_eq!(
            kc.clusters.len(),
            1,
            "the cluster comes from the second file"
        );
        check_names(&kc, &Connection::default()).unwrap();
        let err = merge_list(&[dir.join("missing")]).unwrap_err();
        assert!(err.to_string().contains("none of the files in KUBECONFIG"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_context_cluster_or_user_is_a_clear_error() {
        let kc = kubeconfig(LAB);
        check_names(&kc, &Connection::default()).unwrap();
        let with = |context: Option<&str>, cluster: Option<&str>, user: Option<&str>| Connection {
            kubeconfig: None,
            context: context.map(Into::into),
            cluster: cluster.map(Into::into),
            user: user.map(Into::into),
        };
        let err = |c: Connection| check_names(&kc, &c).unwrap_err().to_string();
        assert_eq!(
            err(with(Some("prod"), None, None)),
            "no context \"prod\" in the kubeconfig (contexts: lab)"
        );
        assert_eq!(
            err(with(None, Some("x"), None)),
            "no cluster \"x\" in the kubeconfig (clusters: lab)"
        );
        assert_eq!(
            err(with(None, None, Some("bob"))),
            "no user \"bob\" in the kubeconfig (users: admin)"
        );
        let none = kubeconfig(&LAB.replace("current-context: lab\n", ""));
        assert_eq!(
            check_names(&none, &Connection::default())
                .unwrap_err()
                .to_string(),
            "the kubeconfig sets no current-context: pass --context (contexts: lab)"
        );
        check_names(&none, &with(Some("lab"), None, None)).unwrap();
    }
}
