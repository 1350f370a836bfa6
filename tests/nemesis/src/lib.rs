//! The nemesis: a seeded, randomized fault campaign on the real lab, in the spirit of Jepsen.
//!
//! One long-lived lab per campaign ([`world`]): namespace machines running `palisade-node`,
//! the control plane, BMCs and a PDU, the lab storage and its CSI attacher, the
//! firmware-bridge, two controllers, and StatefulSet writers on ReadWriteOnce volumes.
//! [`schedule`] draws the fault events from the seed (a pure function, so a seed replays);
//! [`faults`] applies and heals each one; [`observer`] records every NodeFence transition,
//! release and writer pod in the [`history`] (JSON lines), and proves any two live
//! incarnations of the volume-less identity ([`presence`]); [`check`] judges the history
//! (at-most-one and no acknowledged write lost per writer, through the storage checker; at
//! most one live process per volume-less identity; no
//! release without verified evidence in the same NodeFence status; releases only of the fenced
//! node's pods; legal phase transitions; bridge tokens never going down); [`campaign`] ties
//! them together and writes the report, with the command that replays it; [`report`] turns
//! finished campaigns into lines of `docs/data/campaigns.jsonl` and renders those as
//! `docs/campaign-report.md`.

pub mod campaign;
pub mod check;
pub mod faults;
pub mod history;
pub mod observer;
pub mod presence;
pub mod report;
pub mod schedule;
pub mod world;

pub use campaign::{run, Config, Outcome};
