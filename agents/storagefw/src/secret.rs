//! [`Secret`]: a credential that never shows up in `Debug` or `Display` output and is zeroed
//! on drop. One type for the whole project, defined in `palisade-secret` (stored values lose
//! exactly one trailing line ending, nothing else).

pub use palisade_secret::Secret;
