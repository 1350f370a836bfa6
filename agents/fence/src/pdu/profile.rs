//! Vendor profiles as data: which OIDs switch an outlet and read it back, and the values
//! that mean on, off and reboot. Outlet `N` is appended to each OID prefix.

use crate::error::FenceError;

/// One vendor's outlet MIB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// Profile name used in target URLs (`?profile=`).
    pub name: &'static str,
    /// What it is.
    pub description: &'static str,
    /// Control column (writable INTEGER), outlet number appended.
    pub control: &'static [u64],
    /// Status column (readable INTEGER), outlet number appended.
    pub status: &'static [u64],
    /// Outlet name column, if the MIB has one.
    pub names: Option<&'static [u64]>,
    /// Control value: immediate on.
    pub cmd_on: i64,
    /// Control value: immediate off.
    pub cmd_off: i64,
    /// Control value: immediate reboot.
    pub cmd_reboot: i64,
    /// Status value: on.
    pub state_on: i64,
    /// Status value: off.
    pub state_off: i64,
}

/// APC PowerNet MasterSwitch `sPDUOutletCtl` (PowerNet-MIB): control and status are the
/// same column; this is what `fence_apc_snmp` drives for APC MasterSwitch units.
pub const APC_SPDU: Profile = Profile {
    name: "apc",
    description: "APC PowerNet sPDUOutletCtl (.1.3.6.1.4.1.318.1.1.4.4.2.1.3.N)",
    control: &[1, 3, 6, 1, 4, 1, 318, 1, 1, 4, 4, 2, 1, 3],
    status: &[1, 3, 6, 1, 4, 1, 318, 1, 1, 4, 4, 2, 1, 3],
    names: Some(&[1, 3, 6, 1, 4, 1, 318, 1, 1, 4, 4, 2, 1, 4]),
    cmd_on: 1,
    cmd_off: 2,
    cmd_reboot: 3,
    state_on: 1,
    state_off: 2,
};

/// APC PowerNet rack PDU `rPDUOutletControlOutletCommand` / `rPDUOutletStatusOutletState`.
pub const APC_RPDU: Profile = Profile {
    name: "apc-rpdu",
    description: "APC PowerNet rPDUOutletControl (.1.3.6.1.4.1.318.1.1.12.3.3.1.1.4.N)",
    control: &[1, 3, 6, 1, 4, 1, 318, 1, 1, 12, 3, 3, 1, 1, 4],
    status: &[1, 3, 6, 1, 4, 1, 318, 1, 1, 12, 3, 5, 1, 1, 4],
    // rPDUOutletControlOutletName.
    names: Some(&[1, 3, 6, 1, 4, 1, 318, 1, 1, 12, 3, 3, 1, 1, 2]),
    cmd_on: 1,
    cmd_off: 2,
    cmd_reboot: 3,
    state_on: 1,
    state_off: 2,
};

/// CyberPower ePDU `ePDUOutletControlOutletCommand` / `ePDUOutletStatusOutletState`.
pub const CYBERPOWER: Profile = Profile {
    name: "cyberpower",
    description: "CyberPower ePDU (.1.3.6.1.4.1.3808.1.1.3.3.3.1.1.4.N)",
    control: &[1, 3, 6, 1, 4, 1, 3808, 1, 1, 3, 3, 3, 1, 1, 4],
    status: &[1, 3, 6, 1, 4, 1, 3808, 1, 1, 3, 3, 5, 1, 1, 4],
    // ePDUOutletControlOutletName.
    names: Some(&[1, 3, 6, 1, 4, 1, 3808, 1, 1, 3, 3, 3, 1, 1, 2]),
    cmd_on: 1,
    cmd_off: 2,
    cmd_reboot: 3,
    state_on: 1,
    state_off: 2,
};

/// Every built-in profile.
pub const PROFILES: [Profile; 3] = [APC_SPDU, APC_RPDU, CYBERPOWER];

/// `sysObjectID.0`: what kind of device answers.
pub const SYS_OBJECT_ID: &[u64] = &[1, 3, 6, 1, 2, 1, 1, 2, 0];

/// The profile name that asks for detection from `sysObjectID`.
pub const AUTO: &str = "auto";

impl Profile {
    /// The profile for a device reporting `sys_object_id`, as `fence_apc_snmp` chooses it:
    /// APC rack PDUs (`.318.1.3.4.5`, `.318.1.3.4.6`) → `apc-rpdu`, other APC units → `apc`,
    /// CyberPower (`.3808`) → `cyberpower`; an unknown device falls back to `apc` (the
    /// MasterSwitch table), and the second value says which rule chose.
    pub fn detect(sys_object_id: &[u64]) -> (Profile, &'static str) {
        const APC: &[u64] = &[1, 3, 6, 1, 4, 1, 318];
        const CYBERPOWER_ID: &[u64] = &[1, 3, 6, 1, 4, 1, 3808];
        let rack = |tail: u64| {
            let mut p = APC.to_vec();
            p.extend_from_slice(&[1, 3, 4, tail]);
            sys_object_id.starts_with(&p)
        };
        if rack(5) || rack(6) {
            (APC_RPDU, "an APC rack PDU")
        } else if sys_object_id.starts_with(APC) {
            (APC_SPDU, "an APC unit")
        } else if sys_object_id.starts_with(CYBERPOWER_ID) {
            (CYBERPOWER, "a CyberPower unit")
        } else {
            (
                APC_SPDU,
                "an unknown device: falling back to the APC MasterSwitch table",
            )
        }
    }

    /// Looks up a profile by name.
    pub fn by_name(name: &str) -> Result<Profile, FenceError> {
        PROFILES
            .iter()
            .copied()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                FenceError::Config(format!(
                    "unknown PDU profile {name:?} (known: apc, apc-rpdu, cyberpower)"
                ))
            })
    }

    /// `prefix.outlet`.
    pub fn oid(prefix: &[u64], outlet: u32) -> Vec<u64> {
        let mut v = prefix.to_vec();
        v.push(outlet.into());
        v
    }
}

#[cfg(test)]
mod detect_tests {
    use super::*;

    #[test]
    fn sys_object_id_chooses_the_profile_like_fence_apc_snmp() {
        let cases: [(&[u64], &str); 5] = [
            (&[1, 3, 6, 1, 4, 1, 318, 1, 3, 4, 5], "apc-rpdu"),
            (&[1, 3, 6, 1, 4, 1, 318, 1, 3, 4, 6, 1], "apc-rpdu"),
            (&[1, 3, 6, 1, 4, 1, 318, 1, 3, 4, 4], "apc"),
            (&[1, 3, 6, 1, 4, 1, 3808, 1, 1, 3], "cyberpower"),
            (&[1, 3, 6, 1, 4, 1, 8072, 3, 2, 10], "apc"),
        ];
        for (oid, want) in cases {
            assert_eq!(Profile::detect(oid).0.name, want, "{oid:?}");
        }
        assert!(Profile::detect(&[1, 3, 6, 1, 4, 1, 8072])
            .1
            .contains("unknown"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_carry_the_documented_oids() {
        let apc = Profile::by_name("apc").unwrap();
        assert_eq!(
            Profile::oid(apc.control, 7),
            vec![1, 3, 6, 1, 4, 1, 318, 1, 1, 4, 4, 2, 1, 3, 7]
        );
        let cp = Profile::by_name("cyberpower").unwrap();
        assert_eq!(cp.status[6], 3808);
        assert!(Profile::by_name("eaton").is_err());
    }
}
