//! Get System GUID (App 0x37, IPMI 2.0 section 22.14): the managed system's GUID, which pins a
//! BMC to the machine it manages.

use crate::command::Command;
use crate::error::{need, DecodeError};
use crate::message::NETFN_APP;

/// The request (no data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetSystemGuid;

/// A GUID as the BMC sent it: 16 bytes, in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SystemGuid(pub [u8; 16]);

impl SystemGuid {
    /// The bytes in wire order as `8-4-4-4-12` lower-case hex.
    pub fn wire_order(&self) -> String {
        format_guid(&self.0)
    }

    /// The same GUID with its first three fields byte-swapped (the SMBIOS / RFC 4122
    /// little-endian encoding many BMCs use): what some tools print for the same bytes.
    pub fn swapped(&self) -> String {
        let b = self.0;
        let mut s = [0u8; 16];
        s[..4].copy_from_slice(&[b[3], b[2], b[1], b[0]]);
        s[4..6].copy_from_slice(&[b[5], b[4]]);
        s[6..8].copy_from_slice(&[b[7], b[6]]);
        s[8..].copy_from_slice(&b[8..]);
        format_guid(&s)
    }

    /// Whether `pinned` (any case, dashes optional) names this GUID in either byte order.
    ///
    /// Guarantees: a match only when all 16 bytes agree in one of the two encodings.
    pub fn matches(&self, pinned: &str) -> bool {
        let norm = |s: &str| s.to_ascii_lowercase().replace('-', "");
        let want = norm(pinned);
        want.len() == 32 && (want == norm(&self.wire_order()) || want == norm(&self.swapped()))
    }
}

fn format_guid(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

impl Command for GetSystemGuid {
    type Output = SystemGuid;
    const NETFN: u8 = NETFN_APP;
    const CMD: u8 = 0x37;

    fn request_data(&self) -> Vec<u8> {
        Vec::new()
    }

    fn parse(data: &[u8]) -> Result<SystemGuid, DecodeError> {
        need("Get System GUID response", data, 16)?;
        let mut g = [0u8; 16];
        g.copy_from_slice(&data[..16]);
        Ok(SystemGuid(g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_formats_and_matches_both_encodings() {
        let wire: Vec<u8> = (0u8..16).collect();
        let g = GetSystemGuid::parse(&wire).unwrap();
        assert_eq!(g.wire_order(), "00010203-0405-0607-0809-0a0b0c0d0e0f");
        assert_eq!(g.swapped(), "03020100-0504-0706-0809-0a0b0c0d0e0f");
        assert!(g.matches("00010203-0405-0607-0809-0A0B0C0D0E0F"));
        assert!(g.matches(
            "03020100050407060809 0a0b0c0d0e0f"
                .replace(' ', "")
                .as_str()
        ));
        assert!(!g.matches("00010203-0405-0607-0809-0a0b0c0d0e00"));
        assert!(!g.matches(""));
        assert!(GetSystemGuid::parse(&wire[..15]).is_err());
        assert_eq!(GetSystemGuid.request_data(), Vec::<u8>::new());
        assert_eq!((GetSystemGuid::NETFN, GetSystemGuid::CMD), (0x06, 0x37));
    }
}
