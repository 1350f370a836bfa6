//! Whether this machine is virtual, detected the way `systemd-detect-virt` does for virtual
//! machines: the DMI strings the firmware reports (`/sys/class/dmi/id/`), the hypervisor type
//! Xen exposes (`/sys/hypervisor/type`), and the CPU's `hypervisor` flag (`/proc/cpuinfo`).
//!
//! Each renewal advertises the answer (`palisade.dev/virtualization`), because a hypervisor can
//! pause a virtual machine (live migration, a snapshot, `werror=stop`, a suspended host): its
//! watchdog and its clocks freeze with it, and once resumed its pods run beside their
//! replacements. The controller trusts no such machine's self-fence unless its policy accepts
//! virtual machines.
//!
//! The roots are injectable so the rules are tested on fake trees.

use std::path::PathBuf;

use palisade_model::advertise::Virtualization;

/// Where the detection reads: normally `/sys` and `/proc`.
#[derive(Debug, Clone)]
pub struct Roots {
    /// The sysfs root.
    pub sys: PathBuf,
    /// The procfs root.
    pub proc: PathBuf,
}

impl Roots {
    /// The host's `/sys` and `/proc`.
    pub fn host() -> Roots {
        Roots {
            sys: PathBuf::from("/sys"),
            proc: PathBuf::from("/proc"),
        }
    }
}

/// DMI strings (any of the vendor and product fields) that name a hypervisor, by prefix, and
/// the name advertised for it (`systemd-detect-virt`'s names).
const DMI_VENDORS: &[(&str, &str)] = &[
    ("KVM", "kvm"),
    ("OpenStack", "kvm"),
    ("KubeVirt", "kvm"),
    ("Amazon EC2", "amazon"),
    ("QEMU", "qemu"),
    ("VMware", "vmware"),
    ("VMW", "vmware"),
    ("innotek GmbH", "oracle"),
    ("VirtualBox", "oracle"),
    ("Oracle Corporation", "oracle"),
    ("Xen", "xen"),
    ("Bochs", "bochs"),
    ("Parallels", "parallels"),
    ("BHYVE", "bhyve"),
    ("Hyper-V", "microsoft"),
    ("Apple Virtualization", "apple"),
    ("Google Compute Engine", "google"),
];

/// The DMI fields read, in `systemd-detect-virt`'s order.
const DMI_FIELDS: &[&str] = &[
    "product_name",
    "sys_vendor",
    "board_vendor",
    "bios_vendor",
    "product_version",
];

/// What the machine is, as far as the sources under `roots` tell.
///
/// Guarantees: [`Virtualization::None`] only when at least one source was conclusive (the DMI
/// `sys_vendor` was readable, or `/proc/cpuinfo` lists CPU flags) and no source names a
/// hypervisor; [`Virtualization::Unknown`] when no source was conclusive; otherwise
/// [`Virtualization::Virtual`] with the hypervisor's name (`other` when only the CPU flag says
/// so).
///
/// Assumptions: a hypervisor that hides itself from DMI, from `/sys/hypervisor` and from the
/// CPUID `hypervisor` bit is not detected (as with `systemd-detect-virt`): a policy whose
/// machines could be such must not rely on this detection.
pub fn detect(roots: &Roots) -> Virtualization {
    let read = |p: PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let dmi = roots.sys.join("class/dmi/id");
    for field in DMI_FIELDS {
        if let Some(v) = read(dmi.join(field)) {
            // Microsoft's sys_vendor is on its bare-metal machines too; only its product says VM.
            if *field == "product_name"
                && v == "Virtual Machine"
                && read(dmi.join("sys_vendor")).as_deref() == Some("Microsoft Corporation")
            {
                return Virtualization::Virtual("microsoft".into());
            }
            if let Some((_, name)) = DMI_VENDORS.iter().find(|(p, _)| v.starts_with(p)) {
                return Virtualization::Virtual((*name).into());
            }
        }
    }
    if let Some(t) = read(roots.sys.join("hypervisor/type")).filter(|t| !t.is_empty()) {
        let t = t.to_ascii_lowercase();
        let name = if Virtualization::parse(&t).is_some_and(|v| v != Virtualization::None) {
            t
        } else {
            "other".to_string()
        };
        return Virtualization::Virtual(name);
    }
    let cpu_flags = std::fs::read_to_string(roots.proc.join("cpuinfo"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("flags"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, f)| f.split_whitespace().any(|f| f == "hypervisor"))
        });
    match cpu_flags {
        Some(true) => Virtualization::Virtual("other".into()),
        Some(false) => Virtualization::None,
        None if read(dmi.join("sys_vendor")).is_some() => Virtualization::None,
        None => Virtualization::Unknown,
    }
}

/// Whether `v` may be a virtual machine (a hypervisor may decide what its emulated devices do).
pub fn maybe_virtual(v: &Virtualization) -> bool {
    *v != Virtualization::None
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fake_tree::Tree;

    impl Tree {
        fn roots(&self) -> Roots {
            Roots {
                sys: self.0.path().join("sys"),
                proc: self.0.path().join("proc"),
            }
        }
    }

    const BARE_CPU: &str = "processor\t: 0\nflags\t\t: fpu vme de pse sse2\n";
    const VM_CPU: &str = "processor\t: 0\nflags\t\t: fpu vme sse2 hypervisor lahf_lm\n";

    #[test]
    fn the_labs_qemu_machines_are_detected_as_virtual() {
        // QEMU with KVM acceleration (the Q35 machine's default DMI).
        let t = Tree::new();
        t.put("sys/class/dmi/id/sys_vendor", "QEMU\n")
            .put(
                "sys/class/dmi/id/product_name",
                "Standard PC (Q35 + ICH9, 2009)\n",
            )
            .put("proc/cpuinfo", VM_CPU);
        assert_eq!(detect(&t.roots()), Virtualization::Virtual("qemu".into()));
        let t = Tree::new();
        t.put("sys/class/dmi/id/product_name", "KVM\n")
            .put("sys/class/dmi/id/sys_vendor", "Red Hat\n");
        assert_eq!(detect(&t.roots()), Virtualization::Virtual("kvm".into()));
    }

    #[test]
    fn hypervisors_are_named_from_dmi_and_sys_hypervisor() {
        for (field, value, want) in [
            ("sys_vendor", "VMware, Inc.", "vmware"),
            ("product_name", "VirtualBox", "oracle"),
            ("sys_vendor", "Xen", "xen"),
            ("product_name", "Google Compute Engine", "google"),
            ("bios_vendor", "Amazon EC2", "amazon"),
        ] {
            let t = Tree::new();
            t.put(&format!("sys/class/dmi/id/{field}"), value)
                .put("proc/cpuinfo", BARE_CPU);
            assert_eq!(
                detect(&t.roots()),
                Virtualization::Virtual(want.into()),
                "{field}={value}"
            );
        }
        let t = Tree::new();
        t.put("sys/class/dmi/id/sys_vendor", "Microsoft Corporation")
            .put("sys/class/dmi/id/product_name", "Virtual Machine");
        assert_eq!(
            detect(&t.roots()),
            Virtualization::Virtual("microsoft".into())
        );
        let t = Tree::new();
        t.put("sys/hypervisor/type", "xen\n");
        assert_eq!(detect(&t.roots()), Virtualization::Virtual("xen".into()));
    }

    #[test]
    fn the_cpu_hypervisor_flag_alone_makes_a_virtual_machine_of_unknown_kind() {
        let t = Tree::new();
        t.put("proc/cpuinfo", VM_CPU);
        assert_eq!(detect(&t.roots()), Virtualization::Virtual("other".into()));
    }

    #[test]
    fn bare_metal_needs_a_conclusive_source() {
        let t = Tree::new();
        t.put("sys/class/dmi/id/sys_vendor", "Dell Inc.")
            .put("sys/class/dmi/id/product_name", "PowerEdge R650")
            .put("proc/cpuinfo", BARE_CPU);
        assert_eq!(detect(&t.roots()), Virtualization::None);
        // Microsoft's own hardware is not a VM.
        let t = Tree::new();
        t.put("sys/class/dmi/id/sys_vendor", "Microsoft Corporation")
            .put("sys/class/dmi/id/product_name", "Surface Pro");
        assert_eq!(detect(&t.roots()), Virtualization::None);
        // Nothing readable, or a cpuinfo without flags (not x86) and no DMI: cannot tell.
        let t = Tree::new();
        assert_eq!(detect(&t.roots()), Virtualization::Unknown);
        t.put("proc/cpuinfo", "processor\t: 0\nBogoMIPS\t: 50.00\n");
        assert_eq!(detect(&t.roots()), Virtualization::Unknown);
    }
}
