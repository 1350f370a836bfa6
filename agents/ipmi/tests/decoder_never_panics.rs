//! Property: no decoder panics on arbitrary bytes, with or without session keys.

use palisade_ipmi::command::Command;
use palisade_ipmi::crypto::SessionKeys;
use palisade_ipmi::{
    get_channel_auth_capabilities::GetChannelAuthCapabilities,
    get_channel_cipher_suites::{parse_suite_ids, GetChannelCipherSuites},
    get_chassis_status::GetChassisStatus,
    message::Response,
    open_session::OpenSessionResponse,
    rakp::{Rakp2, Rakp4},
    session, CipherSuite,
};
use proptest::prelude::*;

fn keys(id: u8) -> SessionKeys {
    SessionKeys::derive(CipherSuite::from_id(id).unwrap(), &[0x42; 32])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = session::decode(&bytes, None);
        let _ = session::decode(&bytes, Some(&keys(3)));
        let _ = session::decode(&bytes, Some(&keys(17)));
        let _ = Response::decode(&bytes);
        let _ = OpenSessionResponse::decode(&bytes);
        let _ = Rakp2::decode(&bytes);
        let _ = Rakp4::decode(&bytes);
        let _ = GetChassisStatus::parse(&bytes);
        let _ = GetChannelAuthCapabilities::parse(&bytes);
        let _ = GetChannelCipherSuites::parse(&bytes);
        let _ = parse_suite_ids(&bytes);
    }

    /// Datagrams that start like real RMCP+ traffic reach the deeper decoding paths.
    #[test]
    fn rmcp_plus_shaped_datagrams_never_panic(
        type_byte in any::<u8>(),
        len in 0u16..300,
        body in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut d = vec![0x06, 0x00, 0xff, 0x07, 0x06, type_byte, 1, 2, 3, 4, 5, 6, 7, 8];
        d.extend_from_slice(&len.to_le_bytes());
        d.extend_from_slice(&body);
        let _ = session::decode(&d, None);
        let _ = session::decode(&d, Some(&keys(3)));
        let _ = session::decode(&d, Some(&keys(17)));
    }
}
