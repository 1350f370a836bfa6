//! End-to-end tests of `palisade-node` (the tests are in `tests/`; this crate has no code).
//!
//! Build the agent first: `cargo build -p palisade-node --bins`, then
//! `cargo test -p palisade-e2e-node`. Each test file starts one lab whose machines run
//! `palisade-node` under a small supervisor loop, so tests can stop and restart the agent.
