//! Machine identity: the SMBIOS system UUID a Node reports (`status.nodeInfo.systemUUID`)
//! compared with what a fence device says it manages (an IPMI BMC's system GUID, a Redfish
//! ComputerSystem's `UUID`), so that a miswired or mistyped device address never powers off
//! another machine.
//!
//! BMCs encode the same 16 bytes in two orders: as written (RFC 4122) or with the first three
//! fields little-endian (the SMBIOS encoding, which `/sys/class/dmi/id/product_uuid` decodes).
//! Two identities name the same machine when their bytes agree in either order.

/// A system UUID in canonical form (`8-4-4-4-12` lower-case hex), or `None` when `s` is not
/// 32 hex digits (dashes and surrounding blanks allowed): not an identity that can be
/// compared (a Node that reports its name, or nothing).
pub fn normalize_uuid(s: &str) -> Option<String> {
    let hex: String = s.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let h = hex.to_ascii_lowercase();
    // An all-zero or all-ones UUID is what firmware reports when it has none.
    if h.chars().all(|c| c == '0') || h.chars().all(|c| c == 'f') {
        return None;
    }
    Some(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

/// `uuid` (canonical, [`normalize_uuid`]) with its first three fields byte-swapped: the other
/// encoding of the same 16 bytes.
pub fn swapped(uuid: &str) -> String {
    let hex: String = uuid.chars().filter(|c| *c != '-').collect();
    let b: Vec<&str> = (0..16).map(|i| &hex[2 * i..2 * i + 2]).collect();
    let order = [3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15];
    let s: String = order.iter().map(|&i| b[i]).collect();
    normalize_uuid(&s).unwrap_or_default()
}

/// Whether two identities name the same machine (in either byte order).
///
/// Guarantees: `true` only when both are comparable UUIDs ([`normalize_uuid`]) whose 16 bytes
/// agree as written or with the first three fields swapped; anything unreadable is `false`.
pub fn same_machine(a: &str, b: &str) -> bool {
    match (normalize_uuid(a), normalize_uuid(b)) {
        (Some(a), Some(b)) => a == b || swapped(&a) == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_normalize_and_non_uuids_are_not_identities() {
        assert_eq!(
            normalize_uuid(" 0A1B2C3D4E5F60718293A4B5C6D7E8F9\n").as_deref(),
            Some("0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9")
        );
        assert_eq!(normalize_uuid("m0"), None);
        assert_eq!(normalize_uuid(""), None);
        assert_eq!(normalize_uuid("00000000-0000-0000-0000-000000000000"), None);
        assert_eq!(normalize_uuid("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"), None);
        assert_eq!(normalize_uuid("0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8fz"), None);
    }

    #[test]
    fn the_same_machine_in_either_byte_order_and_no_other() {
        let smbios = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";
        let wire = "3d2c1b0a-5f4e-7160-8293-a4b5c6d7e8f9";
        assert!(same_machine(smbios, smbios));
        assert!(same_machine(smbios, wire));
        assert!(same_machine(wire, smbios));
        assert!(same_machine(&smbios.to_uppercase(), &wire.replace('-', "")));
        // One byte off in the tail (not swapped by either encoding).
        assert!(!same_machine(
            smbios,
            "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f8"
        ));
        assert!(!same_machine(smbios, "m0"));
        assert!(!same_machine("m0", "m0"));
    }
}
