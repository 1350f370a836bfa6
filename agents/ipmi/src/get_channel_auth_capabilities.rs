//! Get Channel Authentication Capabilities (App 0x38, IPMI 2.0 section 22.13): asked before
//! every session to learn whether the BMC speaks IPMI v2.0 / RMCP+.
//!
//! It goes out in IPMI v1.5 framing ([`GetChannelAuthCapabilities::v15_datagram`]), as
//! ipmitool sends it: pyghmi-based BMCs (virtualbmc) keep a session per client address and
//! port, never expire it, and forget a stale one only when this request arrives from that
//! address. Without it, a client whose source port repeats (NAT, relays, port reuse) lands in
//! the previous client's session.

use crate::command::Command;
use crate::error::{need, DecodeError};
use crate::message::NETFN_APP;
use crate::Privilege;

/// The "current channel" number.
pub const CURRENT_CHANNEL: u8 = 0x0e;

/// The request: channel (with the "IPMI v2.0 extended data" bit) and privilege level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetChannelAuthCapabilities {
    /// Channel number, normally [`CURRENT_CHANNEL`].
    pub channel: u8,
    /// Privilege level the console intends to use.
    pub privilege: Privilege,
}

/// What the BMC reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthCapabilities {
    /// Channel number answered for.
    pub channel: u8,
    /// The BMC supports IPMI v2.0 (RMCP+) sessions on this channel.
    pub ipmi_v2: bool,
    /// The BMC supports IPMI v1.5 sessions on this channel.
    pub ipmi_v15: bool,
    /// IPMI v1.5 auth type bitmask (bit 0 none, 1 MD2, 2 MD5, 4 password, 5 OEM).
    pub v15_auth_types: u8,
    /// Anonymous login (null user, null password) is enabled.
    pub anonymous_login: bool,
}

impl GetChannelAuthCapabilities {
    /// The whole pre-session datagram: RMCP, an IPMI v1.5 session header with auth type none,
    /// session sequence 0 and session ID 0, then the request with sequence number `rq_seq`.
    pub fn v15_datagram(&self, rq_seq: u8) -> Vec<u8> {
        crate::session::encode_v15(0, 0, &self.request(rq_seq).encode())
    }
}

impl Command for GetChannelAuthCapabilities {
    type Output = AuthCapabilities;
    const NETFN: u8 = NETFN_APP;
    const CMD: u8 = 0x38;

    fn request_data(&self) -> Vec<u8> {
        vec![0x80 | (self.channel & 0x0f), self.privilege as u8]
    }

    fn parse(data: &[u8]) -> Result<AuthCapabilities, DecodeError> {
        need("Get Channel Auth Capabilities response", data, 8)?;
        let extended = data[1] & 0x80 != 0;
        Ok(AuthCapabilities {
            channel: data[0] & 0x0f,
            ipmi_v2: extended && data[3] & 0x02 != 0,
            // Without extended data, only v1.5 is known to be supported.
            ipmi_v15: !extended || data[3] & 0x01 != 0,
            v15_auth_types: data[1] & 0x3f,
            anonymous_login: data[2] & 0x01 != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_request_and_response() {
        let req = GetChannelAuthCapabilities {
            channel: CURRENT_CHANNEL,
            privilege: Privilege::Administrator,
        }
        .request(0);
        assert_eq!(
            req.encode(),
            vec![0x20, 0x18, 0xc8, 0x81, 0x00, 0x38, 0x8e, 0x04, 0xb5]
        );
        // Channel 1, v1.5 types none+MD5+password + extended bit, per-message auth,
        // extended caps v1.5 + v2.0, OEM 0, aux 0.
        let caps =
            GetChannelAuthCapabilities::parse(&[0x01, 0x95, 0x14, 0x03, 0, 0, 0, 0]).unwrap();
        assert_eq!(
            caps,
            AuthCapabilities {
                channel: 1,
                ipmi_v2: true,
                ipmi_v15: true,
                v15_auth_types: 0x15,
                anonymous_login: false,
            }
        );
        let v15_only =
            GetChannelAuthCapabilities::parse(&[0x01, 0x15, 0x14, 0x00, 0, 0, 0, 0]).unwrap();
        assert!(!v15_only.ipmi_v2 && v15_only.ipmi_v15);
        assert!(GetChannelAuthCapabilities::parse(&[1, 2]).is_err());
    }

    #[test]
    fn golden_v15_datagram_is_what_ipmitool_sends_first() {
        let d = GetChannelAuthCapabilities {
            channel: CURRENT_CHANNEL,
            privilege: Privilege::Administrator,
        }
        .v15_datagram(0);
        assert_eq!(
            d,
            vec![
                0x06, 0x00, 0xff, 0x07, // RMCP: version, reserved, no ack, class IPMI
                0x00, // auth type none: IPMI v1.5 framing
                0x00, 0x00, 0x00, 0x00, // session sequence
                0x00, 0x00, 0x00, 0x00, // session ID
                0x09, // message length
                0x20, 0x18, 0xc8, 0x81, 0x00, 0x38, 0x8e, 0x04, 0xb5,
            ]
        );
    }

    #[test]
    fn golden_v15_answer_decodes_to_the_capabilities() {
        // An answer as ipmi_sim sends it: v1.5 framing, rqSeq echoed, completion code 0,
        // channel 1, auth types none/MD2/MD5/password + extended bit, v1.5 + v2.0.
        let datagram = [
            0x06, 0x00, 0xff, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, // headers, length 16
            0x81, 0x1c, 0x63, 0x20, 0x00, 0x38, 0x00, // rsp header, cmd, cc 0
            0x01, 0x97, 0x04, 0x03, 0x00, 0x00, 0x00, 0x00, 0x09, // data, checksum
        ];
        let p = crate::session::decode(&datagram, None).unwrap();
        assert!(!p.authenticated && !p.encrypted);
        let r = crate::message::Response::decode(&p.payload).unwrap();
        let req = GetChannelAuthCapabilities {
            channel: CURRENT_CHANNEL,
            privilege: Privilege::Administrator,
        }
        .request(0);
        assert!(r.answers(&req));
        let caps = crate::command::parse_response::<GetChannelAuthCapabilities>(&r).unwrap();
        let crate::command::Outcome::Ok(caps) = caps else {
            panic!("{caps:?}")
        };
        assert!(caps.ipmi_v2 && caps.ipmi_v15 && caps.channel == 1);
    }
}
