//! `kubectl palisade timeline NODEFENCE [--svg FILE]`: a fence's story, as text and as a
//! picture (phases as bands, device attempts, evidence and releases as marks), to the
//! millisecond from the fence's creation.

use std::fmt::Write;
use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};
use palisade_model::NodeFence;
use serde::Serialize;

use crate::output::OutputArg;
use crate::world::{secs, to_ms};

/// One moment of the story.
#[derive(Debug, Clone)]
pub struct Mark {
    /// When.
    pub at: Timestamp,
    /// Which lane: `phase`, `device`, `evidence`, `release`, `recovery`.
    pub lane: &'static str,
    /// What happened.
    pub text: String,
}

/// Every moment of the fence's story, in time order.
pub fn marks(f: &NodeFence) -> Vec<Mark> {
    let mut out = Vec::new();
    let Some(st) = &f.status else {
        return out;
    };
    for t in &st.transitions {
        out.push(Mark {
            at: t.at.0,
            lane: "phase",
            text: format!("{} — {}", t.phase.as_str(), t.message),
        });
    }
    for a in &st.attempts {
        out.push(Mark {
            at: a.at.0,
            lane: "device",
            text: format!(
                "level {} {:?} {} → {:?} (token {}) {}",
                a.level, a.action, a.device, a.outcome, a.token, a.message
            ),
        });
    }
    for e in &st.evidence {
        out.push(Mark {
            at: e.at.0,
            lane: "evidence",
            text: format!(
                "level {} {:?} from {}: {}",
                e.level, e.kind, e.device, e.observed
            ),
        });
    }
    if let Some(t) = &st.release.tainted_at {
        out.push(Mark {
            at: t.0,
            lane: "release",
            text: "node tainted palisade.dev/fenced:NoSchedule".into(),
        });
    }
    if let Some(t) = &st.release.out_of_service_at {
        out.push(Mark {
            at: t.0,
            lane: "release",
            text: "node tainted out-of-service".into(),
        });
    }
    for r in &st.release.power_rechecks {
        out.push(Mark {
            at: r.at.0,
            lane: "release",
            text: format!(
                "power re-read {} → {:?} (token {}): {}",
                palisade_model::target::redact_url(&r.device),
                r.state,
                r.token,
                r.observed
            ),
        });
    }
    for (what, list) in [
        ("pod", &st.release.pods),
        ("VolumeAttachment", &st.release.attachments),
        ("attach record", &st.release.attach_records),
    ] {
        for o in list {
            let name = if o.namespace.is_empty() {
                o.name.clone()
            } else {
                format!("{}/{}", o.namespace, o.name)
            };
            out.push(Mark {
                at: o.at.0,
                lane: "release",
                text: format!("released {what} {name}"),
            });
        }
    }
    for o in &st.release.held {
        out.push(Mark {
            at: o.at.0,
            lane: "release",
            text: format!(
                "HELD pod {}/{} (not covered by the fence)",
                o.namespace, o.name
            ),
        });
    }
    for (what, t) in [
        ("powered on", &st.recovery.powered_on_at),
        ("unfenced", &st.recovery.unfenced_at),
        ("untainted", &st.recovery.untainted_at),
    ] {
        if let Some(t) = t {
            out.push(Mark {
                at: t.0,
                lane: "recovery",
                text: what.to_string(),
            });
        }
    }
    out.sort_by_key(|m| m.at);
    out
}

/// What `timeline` shows.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeline {
    pub name: String,
    pub node: String,
    pub requested_by: String,
    pub reason: String,
    /// Time zero: the first recorded moment (RFC 3339).
    pub start: String,
    /// Every moment, in time order.
    pub marks: Vec<MarkRow>,
    /// How it failed, if it did.
    pub failure: Option<Failure>,
}

/// One moment, as shown.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MarkRow {
    /// When (RFC 3339).
    pub at: String,
    /// Seconds after `start`.
    pub offset_seconds: f64,
    /// `phase`, `device`, `evidence`, `release` or `recovery`.
    pub lane: String,
    pub text: String,
}

/// A fence's failure.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub phase: String,
    pub reason: String,
    pub message: String,
}

/// Time zero: the request's first recorded moment (creationTimestamp has whole seconds).
fn start(f: &NodeFence, ms: &[Mark]) -> Timestamp {
    ms.first()
        .map(|m| m.at)
        .or_else(|| f.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or_else(Timestamp::now)
}

/// The report of NodeFence `f` whose moments are `ms`, from `t0`.
pub fn report(f: &NodeFence, t0: Timestamp, ms: &[Mark]) -> Timeline {
    Timeline {
        name: f.metadata.name.clone().unwrap_or_default(),
        node: f.spec.node_name.clone(),
        requested_by: format!("{:?}", f.spec.requested_by),
        reason: f.spec.reason.clone(),
        start: t0.to_string(),
        marks: ms
            .iter()
            .map(|m| MarkRow {
                at: m.at.to_string(),
                offset_seconds: to_ms(secs(t0, m.at)),
                lane: m.lane.to_string(),
                text: m.text.clone(),
            })
            .collect(),
        failure: f
            .status
            .as_ref()
            .and_then(|st| st.failure.as_ref())
            .map(|fail| Failure {
                phase: fail.phase.as_str().to_string(),
                reason: fail.reason.as_str().to_string(),
                message: fail.message.clone(),
            }),
    }
}

/// The report as the text `timeline` prints.
pub fn text(t: &Timeline) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "nodefence/{}: node {}, requested by {}: {}",
        t.name, t.node, t.requested_by, t.reason
    );
    for m in &t.marks {
        let _ = writeln!(o, "{:>+9.3}s  {:<9} {}", m.offset_seconds, m.lane, m.text);
    }
    if let Some(fail) = &t.failure {
        let _ = writeln!(
            o,
            "FAILED in {}: {} — {}",
            fail.phase, fail.reason, fail.message
        );
    }
    o
}

/// Prints the story; with `svg` and/or `png`, also draws it.
pub async fn run(
    c: &Client,
    name: &str,
    svg: Option<&Path>,
    png: Option<&Path>,
    out: OutputArg,
) -> anyhow::Result<u8> {
    let api: Api<NodeFence> = Api::all(c.clone());
    let Some(f) = api.get_opt(name).await? else {
        anyhow::bail!("no NodeFence named {name:?}");
    };
    let ms = marks(&f);
    let t0 = start(&f, &ms);
    crate::output::print(out, &report(&f, t0, &ms), text)?;
    // With -o, standard output holds one document: the pictures are noted on standard error.
    let noted = |path: &Path| {
        if out.format.is_some() {
            eprintln!("picture: {}", path.display());
        } else {
            println!("picture: {}", path.display());
        }
    };
    let picture = render_svg(&f, t0, &ms);
    if let Some(path) = svg {
        std::fs::write(path, &picture)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
        noted(path);
    }
    if let Some(path) = png {
        to_png(&picture, path)?;
        noted(path);
    }
    Ok(0)
}

/// Renders the SVG to a PNG with `rsvg-convert` (Debian's `librsvg2-bin`), fed on stdin.
fn to_png(svg: &str, path: &Path) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("rsvg-convert")
        .args(["--format", "png", "--background-color", "white", "--output"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("rsvg-convert (install librsvg2-bin) for --png: {e}"))?;
    child
        .stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("rsvg-convert: no stdin"))?
        .write_all(svg.as_bytes())?;
    let status = child.wait()?;
    anyhow::ensure!(status.success(), "rsvg-convert failed ({status})");
    Ok(())
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The picture: a time axis in seconds, one band per phase, one row per other mark.
pub fn render_svg(f: &NodeFence, t0: Timestamp, ms: &[Mark]) -> String {
    // The axis runs a little past the last moment, so the last phase has a visible band.
    let end = (ms.last().map_or(1.0, |m| secs(t0, m.at)) * 1.15).max(0.001);
    let (left, width) = (40.0, 760.0);
    let x = |t: Timestamp| left + width * (secs(t0, t) / end).clamp(0.0, 1.0);
    let rows: Vec<&Mark> = ms.iter().filter(|m| m.lane != "phase").collect();
    let height = 120 + 18 * rows.len();
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="1400" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="16" font-size="13">nodefence/{} — node {}</text>"#,
        escape(&f.metadata.name.clone().unwrap_or_default()),
        escape(&f.spec.node_name)
    );
    let phases: Vec<&Mark> = ms.iter().filter(|m| m.lane == "phase").collect();
    let colours = [
        "#9ecae1", "#fdae6b", "#e6550d", "#74c476", "#31a354", "#bcbddc", "#756bb1", "#969696",
    ];
    for (i, p) in phases.iter().enumerate() {
        let x0 = x(p.at);
        let x1 = phases.get(i + 1).map_or(left + width, |n| x(n.at));
        let phase = p.text.split(" — ").next().unwrap_or_default();
        let _ = writeln!(
            s,
            r#"<g class="phase" data-phase="{}"><rect x="{x0:.1}" y="28" width="{:.1}" height="24" fill="{}"/><text x="{:.1}" y="44">{}</text></g>"#,
            escape(phase),
            (x1 - x0).max(1.0),
            colours[i % colours.len()],
            x0 + 2.0,
            escape(phase)
        );
    }
    let _ = writeln!(
        s,
        r#"<line x1="{left}" y1="60" x2="{}" y2="60" stroke="black"/>"#,
        left + width
    );
    for k in 0..=4 {
        let t = end * f64::from(k) / 4.0;
        let xx = left + width * f64::from(k) / 4.0;
        let _ = writeln!(
            s,
            r#"<text x="{xx:.1}" y="74" text-anchor="middle">{t:.3}s</text>"#
        );
    }
    for (i, m) in rows.iter().enumerate() {
        let y = 96 + 18 * i;
        let xx = x(m.at);
        let colour = match m.lane {
            "device" => "#3182bd",
            "evidence" => "#31a354",
            "release" => "#e6550d",
            _ => "#756bb1",
        };
        let _ = writeln!(
            s,
            r#"<g class="{}"><circle cx="{xx:.1}" cy="{}" r="4" fill="{colour}"/><text x="{:.1}" y="{}">+{:.3}s {}</text></g>"#,
            m.lane,
            y - 4,
            xx + 8.0,
            y,
            secs(t0, m.at),
            escape(&m.text.chars().take(100).collect::<String>())
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_story_is_told_in_time_order_in_text_and_json_alike() {
        let f: NodeFence = serde_json::from_value(serde_json::json!({
            "apiVersion": "palisade.dev/v1alpha1",
            "kind": "NodeFence",
            "metadata": {"name": "m1-abc"},
            "spec": {"nodeName": "m1", "reason": "silent", "requestedBy": "Controller"},
        }))
        .unwrap();
        let t0: Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        let later: Timestamp = "2026-01-02T03:04:06.250Z".parse().unwrap();
        let ms = vec![
            Mark {
                at: t0,
                lane: "phase",
                text: "Pending — requested".into(),
            },
            Mark {
                at: later,
                lane: "release",
                text: "node tainted".into(),
            },
        ];
        let r = report(&f, start(&f, &ms), &ms);
        assert_eq!(
            text(&r),
            "nodefence/m1-abc: node m1, requested by Controller: silent\n   +0.000s  phase     Pending — requested\n   +1.250s  release   node tainted\n"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["requestedBy"], "Controller");
        assert_eq!(json["start"], "2026-01-02T03:04:05Z");
        assert_eq!(
            json["marks"][1],
            serde_json::json!({"at": "2026-01-02T03:04:06.25Z", "offsetSeconds": 1.25, "lane": "release", "text": "node tainted"})
        );
        assert_eq!(json["failure"], serde_json::Value::Null);
    }
}
