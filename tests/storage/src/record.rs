//! What the writer stores and what it remembers: record and acknowledgement formats (JSON).

use serde::{Deserialize, Serialize};

/// One writer record, stored as the payload of a volume record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterRecord {
    /// UID of the pod that wrote it (each incarnation of a StatefulSet identity differs).
    pub pod_uid: String,
    /// Pod name (the StatefulSet identity, for example `web-0`).
    #[serde(default)]
    pub pod: String,
    /// Node the pod ran on.
    pub node: String,
    /// Per-pod sequence number, starting at 0.
    pub seq: u64,
    /// Writer wall-clock time, milliseconds since the Unix epoch.
    pub ts_ms: u64,
}

/// One acknowledgement, a line of the writer's ack log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// UID of the writing pod.
    pub pod_uid: String,
    /// Node the pod ran on.
    pub node: String,
    /// The record's sequence number.
    pub seq: u64,
    /// The offset the server acknowledged.
    pub offset: u64,
    /// Writer time at acknowledgement, ms since the Unix epoch.
    pub ack_ms: u64,
}

/// Parses an ack log (JSON lines). A torn last line (the writer was killed while writing it)
/// is ignored; any other bad line is an error.
pub fn parse_ack_log(text: &str) -> Result<Vec<Ack>, (usize, serde_json::Error)> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(a) => out.push(a),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(e) => return Err((i + 1, e)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_last_ack_line_is_ignored_but_corrupt_middle_is_not() {
        let good = r#"{"pod_uid":"a","node":"m0","seq":0,"offset":0,"ack_ms":1}"#;
        let text = format!("{good}\n{{\"pod_uid\":\"a\",\"no");
        assert_eq!(parse_ack_log(&text).unwrap().len(), 1);
        let text = format!("{good}\ngarbage\n{good}\n");
        assert_eq!(parse_ack_log(&text).unwrap_err().0, 2);
    }
}
