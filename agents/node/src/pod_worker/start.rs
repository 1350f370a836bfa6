//! Container start: init containers in order (sidecars stay up), then the main containers;
//! building each container's configuration (image, environment, command, mounts) and running
//! its postStart hook.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ContainerState, ContainerStateRunning, LifecycleHandler,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;

use super::image::{self, ImageConfig};
use super::{Ctr, Kind, Worker};
use crate::image::ImageError;
use crate::probe::ProbeOutcome;
use crate::runtime::{ContainerConfig, RuntimeError};
use crate::volumes;

/// How soon a container whose image is being pulled looks again (the pull itself runs in the
/// background; looking is an in-memory check).
const PULL_POLL: Duration = Duration::from_millis(250);

impl Worker {
    pub(super) async fn start_due(&mut self) {
        let now = Instant::now();
        // Init containers in order; sidecars stay running.
        for i in 0..self.ctrs.len() {
            let kind = self.ctrs[i].kind;
            if kind == Kind::Main {
                break;
            }
            let c = &self.ctrs[i];
            let done = match kind {
                Kind::Init => c.init_done,
                _ => c.running() && c.startup_ok,
            };
            if c.id.is_none()
                && !(kind == Kind::Init && c.init_done)
                && c.restart_at.is_none_or(|t| t <= now)
            {
                self.start(i).await;
                return;
            }
            if !done {
                return;
            }
        }
        for i in 0..self.ctrs.len() {
            let c = &self.ctrs[i];
            if c.kind == Kind::Main
                && c.id.is_none()
                && !c.finished
                && c.restart_at.is_none_or(|t| t <= now)
            {
                self.start(i).await;
            }
        }
    }

    pub(super) async fn start(&mut self, i: usize) {
        let started = Instant::now();
        let sources =
            crate::env::fetch(&self.ctx.client, &self.pref.namespace, &self.ctrs[i].spec).await;
        let prepared = sources
            .map_err(|e| ("CreateContainerConfigError".to_string(), e.to_string()))
            .and_then(|s| self.config_of(&self.ctrs[i], &s));
        let (cfg, _img, mounts) = match prepared {
            Ok(v) => v,
            Err((reason, msg)) => {
                let c = &mut self.ctrs[i];
                let image = c.spec.image.clone().unwrap_or_default();
                if reason == ImageError::PULLING_REASON {
                    // A pull under way: look again soon (the pull runs in the background), and
                    // say so once, as the kubelet's `Pulling`.
                    let first = c.pulling_since.is_none();
                    c.pulling_since.get_or_insert_with(Instant::now);
                    c.set_waiting(&reason, Some(msg));
                    c.restart_at = Some(Instant::now() + PULL_POLL);
                    if first {
                        self.event(false, "Pulling", format!("Pulling image \"{image}\""));
                    }
                    return;
                }
                c.pulling_since = None;
                let already =
                    c.state.waiting.as_ref().and_then(|w| w.message.as_deref()) == Some(&msg);
                c.set_waiting(&reason, Some(msg.clone()));
                c.restart_at = Some(Instant::now() + Duration::from_secs(5));
                if !already {
                    let name = c.spec.name.clone();
                    match reason.as_str() {
                        "ErrImagePull" => self.event(
                            true,
                            "Failed",
                            format!("Failed to pull image \"{image}\": {msg}"),
                        ),
                        "ImagePullBackOff" => self.event(
                            false,
                            "BackOff",
                            format!("Back-off pulling image \"{image}\""),
                        ),
                        _ => {}
                    }
                    self.event(
                        true,
                        "Failed",
                        format!("Error: {reason}: container {name}: {msg}"),
                    );
                }
                return;
            }
        };
        if cfg.rootfs.is_some() {
            let image = self.ctrs[i].spec.image.clone().unwrap_or_default();
            let message = match self.ctrs[i].pulling_since.take() {
                Some(t) => format!(
                    "Successfully pulled image \"{image}\" in {:.3}s",
                    t.elapsed().as_secs_f64()
                ),
                None => format!("Container image \"{image}\" already present on machine"),
            };
            self.event(false, "Pulled", message);
        }
        let name = self.ctrs[i].spec.name.clone();
        if self.ctrs[i].next_attempt > 0 {
            self.ctrs[i].restart_count += 1;
        }
        self.ctrs[i].next_attempt += 1;
        self.ctrs[i].restart_at = None;
        match self.ctx.runtime.start_with_mounts(&cfg, &mounts).await {
            Ok(info) => {
                self.ctx.metrics.observe_start(started.elapsed());
                let c = &mut self.ctrs[i];
                c.id = Some(info.id.clone());
                c.started = Some((Instant::now(), info.started_at));
                c.state = ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(info.started_at)),
                    }),
                    ..Default::default()
                };
                c.startup_ok = c.spec.startup_probe.is_none();
                c.ready = c.startup_ok && c.spec.readiness_probe.is_none();
                Self::make_probes(c);
                self.save();
                self.event(false, "Started", format!("Started container {name}"));
                if let Some(h) = self.ctrs[i]
                    .spec
                    .lifecycle
                    .as_ref()
                    .and_then(|l| l.post_start.clone())
                {
                    let ports = self.ctrs[i].spec.ports.clone();
                    if let Err(msg) = self
                        .run_hook(&info.id, &h, ports, Duration::from_secs(30))
                        .await
                    {
                        self.event(
                            true,
                            "FailedPostStartHook",
                            format!("PostStartHook failed for {name}: {msg}"),
                        );
                        let _ = self.ctx.runtime.kill_all(&info.id).await;
                    }
                }
            }
            Err(RuntimeError::MountFailed { message, .. }) => {
                // As the kubelet's CreateContainerError: the container never ran, so it
                // waits (no restart counted) and the agent retries.
                let _ = self.ctx.runtime.remove(&cfg.id()).await;
                let c = &mut self.ctrs[i];
                c.next_attempt -= 1;
                if c.next_attempt > 0 {
                    c.restart_count = c.restart_count.saturating_sub(1);
                }
                let already =
                    c.state.waiting.as_ref().and_then(|w| w.message.as_deref()) == Some(&message);
                c.set_waiting("CreateContainerError", Some(message.clone()));
                c.restart_at = Some(Instant::now() + Duration::from_secs(5));
                self.save();
                if !already {
                    self.event(
                        true,
                        "Failed",
                        format!("Error: CreateContainerError: container {name}: {message}"),
                    );
                }
            }
            Err(e) => {
                self.save();
                let msg = wait_reason(&e);
                self.event(
                    true,
                    "Failed",
                    format!("Error: failed to start container {name}: {msg}"),
                );
                let policy = self.restart_policy();
                self.ctrs[i].started = Some((Instant::now(), Timestamp::now()));
                if let Some(id) = Some(cfg.id()) {
                    let _ = self.ctx.runtime.remove(&id).await;
                }
                self.on_exit(
                    i,
                    128,
                    None,
                    "StartError",
                    Some(msg),
                    Timestamp::now(),
                    &policy,
                )
                .await;
            }
        }
    }

    pub(super) fn config_of(
        &self,
        c: &Ctr,
        sources: &crate::env::Sources,
    ) -> Result<(ContainerConfig, ImageConfig, Vec<crate::mounts::Mount>), (String, String)> {
        let (rootfs, img) = image::image_of(
            &self.ctx,
            &image::PodImages::of(&self.pod, &self.pref),
            &c.spec,
        )
        .map_err(|e| (e.reason().to_string(), e.to_string()))?;
        let resolved = self
            .env_of(&c.spec, sources)
            .map_err(|e| ("CreateContainerConfigError".to_string(), e.to_string()))?;
        if !resolved.skipped.is_empty() {
            self.event(
                true,
                "InvalidEnvironmentVariableNames",
                format!(
                    "Keys [{}] were skipped since they are considered invalid environment variable names",
                    resolved.skipped.join(", ")
                ),
            );
        }
        let mut env = resolved.vars;
        for (k, v) in &img.env {
            if !env.iter().any(|(ek, _)| ek == k) {
                env.push((k.clone(), v.clone()));
            }
        }
        let mut argv: Vec<String> = match &c.spec.command {
            Some(cmd) if !cmd.is_empty() => {
                cmd.iter().map(|s| crate::env::expand(s, &env)).collect()
            }
            _ => img.entrypoint.clone(),
        };
        match &c.spec.args {
            Some(a) if !a.is_empty() || c.spec.command.is_some() => {
                argv.extend(a.iter().map(|s| crate::env::expand(s, &env)))
            }
            _ if c.spec.command.is_none() => argv.extend(img.cmd.iter().cloned()),
            _ => {}
        }
        if argv.is_empty() {
            return Err((
                "CreateContainerError".into(),
                "no command specified: the container has no command and its image no entrypoint"
                    .into(),
            ));
        }
        let no_dirs = std::collections::BTreeMap::new();
        let dirs = self.sandbox.as_ref().map_or(&no_dirs, |s| &s.dirs);
        let mounts = crate::mounts::plan(
            c.spec.volume_mounts.as_deref().unwrap_or_default(),
            dirs,
            rootfs.is_none(),
        )
        .map_err(|e| ("CreateContainerError".to_string(), e.to_string()))?;
        Ok((
            ContainerConfig {
                pod_uid: self.pref.uid.clone(),
                name: c.spec.name.clone(),
                attempt: c.next_attempt,
                argv,
                env,
                working_dir: c.spec.working_dir.clone().or(img.working_dir.clone()),
                rootfs,
            },
            img,
            mounts,
        ))
    }

    pub(super) fn env_of(
        &self,
        c: &Container,
        sources: &crate::env::Sources,
    ) -> Result<crate::env::Resolved, crate::env::EnvError> {
        let mut env = vec![
            (
                "PATH".to_string(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            ),
            ("HOSTNAME".to_string(), self.pref.name.clone()),
        ];
        env.extend(self.ctx.api_service.env());
        if let Some(s) = &self.sandbox {
            for (name, dir) in &s.dirs {
                env.push((volumes::env_name(name), dir.display().to_string()));
            }
            for (k, v) in &s.env {
                env.push((k.clone(), v.clone()));
            }
        }
        crate::env::resolve(&self.pref.namespace, c, env, sources, |p| self.field(p))
    }

    /// Resolves a `fieldRef` path of this pod.
    pub(super) fn field(&self, path: &str) -> Result<String, String> {
        let m = &self.pod.metadata;
        Ok(match path {
            "metadata.name" => self.pref.name.clone(),
            "metadata.namespace" => self.pref.namespace.clone(),
            "metadata.uid" => self.pref.uid.clone(),
            "spec.nodeName" => self.ctx.node_name.clone(),
            "spec.serviceAccountName" => self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
            "status.podIP" | "status.hostIP" => self.ctx.address.to_string(),
            p => {
                let map = if p.starts_with("metadata.labels['") {
                    &m.labels
                } else if p.starts_with("metadata.annotations['") {
                    &m.annotations
                } else {
                    return Err(format!("unsupported fieldRef {p:?}"));
                };
                let key = p
                    .split_once("['")
                    .map(|(_, k)| k.trim_end_matches("']"))
                    .unwrap_or_default();
                map.as_ref()
                    .and_then(|l| l.get(key).cloned())
                    .unwrap_or_default()
            }
        })
    }

    pub(super) async fn run_hook(
        &self,
        id: &str,
        h: &LifecycleHandler,
        ports: Option<Vec<ContainerPort>>,
        timeout: Duration,
    ) -> Result<(), String> {
        if let Some(e) = &h.exec {
            let argv = e.command.clone().unwrap_or_default();
            return match self.ctx.runtime.exec(id, &argv, timeout).await {
                Ok(0) => Ok(()),
                Ok(code) => Err(format!("command {argv:?} exited with {code}")),
                Err(e) => Err(e.to_string()),
            };
        }
        if let Some(g) = &h.http_get {
            let ports = ports.unwrap_or_default();
            return match crate::probe::http_get(g, self.ctx.address, &ports, timeout).await {
                ProbeOutcome::Success => Ok(()),
                ProbeOutcome::Failure(m) | ProbeOutcome::Error(m) => Err(m),
            };
        }
        if let Some(s) = &h.sleep {
            tokio::time::sleep(
                Duration::from_secs(u64::try_from(s.seconds).unwrap_or(0)).min(timeout),
            )
            .await;
            return Ok(());
        }
        Err("unsupported hook handler".into())
    }
}

fn wait_reason(e: &RuntimeError) -> String {
    e.to_string()
}
