//! `imagePullPolicy`, decided by one pure function: use the local image, pull, wait for the
//! pull under way, report the failure, back off, or refuse (`Never`).

use std::time::Duration;

use super::reference::Reference;

/// How long a pull with `Always` counts as fresh: the kubelet pulls on every container
/// start, and the worker asks several times per start (configuration, stop signal, retries).
pub const ALWAYS_FRESH_FOR: Duration = Duration::from_secs(30);

/// A container's `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    /// Pull on every start.
    Always,
    /// Pull only when the image is not on the node.
    IfNotPresent,
    /// Never pull.
    Never,
}

impl PullPolicy {
    /// The policy as the pod gives it, defaulted as the API server does: `Always` for
    /// `:latest` (or no tag) without a digest, else `IfNotPresent`.
    pub fn of(spec: Option<&str>, r: &Reference) -> PullPolicy {
        match spec {
            Some("Always") => PullPolicy::Always,
            Some("Never") => PullPolicy::Never,
            Some("IfNotPresent") => PullPolicy::IfNotPresent,
            _ if r.digest.is_none() && r.tag.as_deref().is_none_or(|t| t == "latest") => {
                PullPolicy::Always
            }
            _ => PullPolicy::IfNotPresent,
        }
    }
}

/// What the agent knows about an image reference right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Known {
    /// The image is in the store; how long ago its reference was last pulled.
    pub local_age: Option<Duration>,
    /// A pull is under way.
    pub pulling: bool,
    /// The last pull failed: whether that was reported yet, and how long until the next try.
    pub failed: Option<(bool, Duration)>,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Run the local image.
    UseLocal,
    /// Start a pull.
    Pull,
    /// A pull is under way.
    Wait,
    /// Report the last failure (`ErrImagePull`), once.
    ReportFailure,
    /// Wait out the back-off (`ImagePullBackOff`).
    BackOff(Duration),
    /// `Never` and no local image (`ErrImageNeverPull`).
    NeverPull,
}

/// Decides what to do for `policy` given what is known.
pub fn decide(policy: PullPolicy, k: Known) -> Decision {
    let usable = match (policy, k.local_age) {
        (_, None) => false,
        (PullPolicy::Always, Some(age)) => age < ALWAYS_FRESH_FOR,
        (_, Some(_)) => true,
    };
    if usable {
        return Decision::UseLocal;
    }
    if policy == PullPolicy::Never {
        return Decision::NeverPull;
    }
    if k.pulling {
        return Decision::Wait;
    }
    match k.failed {
        Some((false, _)) => Decision::ReportFailure,
        Some((true, wait)) if !wait.is_zero() => Decision::BackOff(wait),
        _ => Decision::Pull,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Decision::*;
    use PullPolicy::*;

    #[test]
    fn policy_defaults_follow_the_api_server() {
        let r = |s: &str| Reference::parse(s).unwrap();
        assert_eq!(PullPolicy::of(None, &r("r.example/a")), Always);
        assert_eq!(PullPolicy::of(None, &r("r.example/a:latest")), Always);
        assert_eq!(PullPolicy::of(None, &r("r.example/a:v1")), IfNotPresent);
        let pinned = format!("r.example/a@sha256:{}", "0".repeat(64));
        assert_eq!(PullPolicy::of(None, &r(&pinned)), IfNotPresent);
        assert_eq!(PullPolicy::of(Some("Never"), &r("r.example/a")), Never);
        assert_eq!(PullPolicy::of(Some("Always"), &r("r.example/a:v1")), Always);
    }

    #[test]
    fn decisions_for_every_policy_and_state() {
        let s = Duration::from_secs;
        let local = |age| Known {
            local_age: Some(s(age)),
            ..Default::default()
        };
        let failed = |reported, wait| Known {
            failed: Some((reported, s(wait))),
            ..Default::default()
        };
        let pulling = Known {
            pulling: true,
            ..Default::default()
        };
        let nothing = Known::default();
        let table = [
            (Never, local(9999), UseLocal),
            (Never, nothing, NeverPull),
            (Never, failed(false, 5), NeverPull),
            (IfNotPresent, local(9999), UseLocal),
            (IfNotPresent, nothing, Pull),
            (IfNotPresent, pulling, Wait),
            (IfNotPresent, failed(false, 10), ReportFailure),
            (IfNotPresent, failed(true, 10), BackOff(s(10))),
            (IfNotPresent, failed(true, 0), Pull),
            (Always, local(1), UseLocal),
            (Always, local(60), Pull),
            (
                Always,
                Known {
                    local_age: Some(s(60)),
                    pulling: true,
                    failed: None,
                },
                Wait,
            ),
            (
                Always,
                Known {
                    local_age: Some(s(60)),
                    pulling: false,
                    failed: Some((true, s(20))),
                },
                BackOff(s(20)),
            ),
        ];
        for (policy, known, want) in table {
            assert_eq!(decide(policy, known), want, "{policy:?} {known:?}");
        }
    }
}
