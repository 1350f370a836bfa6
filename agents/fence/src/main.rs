//! `palisade-fence`: a fence agent compatible with the ClusterLabs fence-agents conventions.
//!
//! Options come as long flags or as `name=value` lines on stdin (when no flags are given).
//! Example (the password never goes on the command line):
//!
//! ```text
//! printf 'action=status\nip=127.0.0.1\nipport=6230\nlogin=admin\npasswd_script=cat /run/bmc.pw\nlanplus=1\n' | palisade-fence
//! ```
//!
//! Exit codes: 0 success (status: on), 1 failure, 2 status off.

use std::io::{IsTerminal, Read};

use anyhow::Context;
use palisade_fence::cli::{self, Action, Invocation, EXIT_ERROR, EXIT_OFF, EXIT_OK};
use palisade_fence::{Device, PowerDevice, PowerState};

fn main() {
    let code = match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Failed: {}", message(&e));
            EXIT_ERROR
        }
    };
    std::process::exit(code);
}

/// The error and its causes, each cause only when its text is not already in the message:
/// the library errors print their source inline, and `{:#}` would print it twice.
fn message(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}

fn run() -> anyhow::Result<i32> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Like fence-agents: options come from stdin when none are given on the command line.
    let mut opts = if args.is_empty() {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading options from stdin")?;
        cli::parse_stdin(&text)?
    } else {
        Default::default()
    };
    opts.extend(cli::parse_args(&args)?);
    if opts.contains_key("help") {
        println!("usage: palisade-fence [--action ACTION] [--ip HOST] ... (or name=value lines on stdin); see -o metadata");
        return Ok(EXIT_OK);
    }
    let inv = Invocation::resolve(&opts, &|k| std::env::var(k).ok())?;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Pacemaker logs our stderr: colour codes only for a person at a terminal.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(if inv.verbose { "debug" } else { "warn" })
        .init();
    if inv.action == Action::Metadata {
        print!("{}", cli::metadata());
        return Ok(EXIT_OK);
    }
    let target = inv.target.clone().context("no target")?;
    let device = Device::new(target, &inv.credentials, inv.options)?;
    if inv.action == Action::ValidateAll {
        return Ok(EXIT_OK);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(act(&inv, &device))
}

async fn act(inv: &Invocation, device: &Device) -> anyhow::Result<i32> {
    Ok(match inv.action {
        Action::Status => match device.status().await? {
            PowerState::On => {
                println!("Status: ON");
                EXIT_OK
            }
            PowerState::Off => {
                println!("Status: OFF");
                EXIT_OFF
            }
            PowerState::Unknown => {
                println!("Status: UNKNOWN");
                EXIT_ERROR
            }
        },
        Action::Off => {
            let ev = device.off().await?;
            println!(
                "Success: Powered OFF (verified after {} ms, {} status reads)",
                ev.command_to_verified().as_millis(),
                ev.polls()
            );
            EXIT_OK
        }
        Action::On => {
            device.on().await?;
            println!("Success: Powered ON");
            EXIT_OK
        }
        Action::Reboot => {
            if inv.cycle {
                if let Device::Ipmi(d) = device {
                    d.chassis_control(palisade_ipmi::chassis_control::ChassisControl::PowerCycle)
                        .await?;
                    println!("Success: Power cycled");
                    return Ok(EXIT_OK);
                }
            }
            let (off, _on) = device.reboot().await?;
            println!(
                "Success: Rebooted (off verified after {} ms)",
                off.command_to_verified().as_millis()
            );
            EXIT_OK
        }
        Action::Monitor => {
            device.monitor().await?;
            EXIT_OK
        }
        Action::List => {
            for (plug, name) in device.list().await? {
                println!("{plug},{name}");
            }
            EXIT_OK
        }
        Action::Metadata | Action::ValidateAll => EXIT_OK,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_is_printed_once() {
        let e = anyhow::Error::new(palisade_fence::FenceError::Unreachable {
            device: "ipmi://a@bmc:623".into(),
            source: std::io::Error::other("connection refused"),
        })
        .context("status");
        let m = message(&e);
        assert_eq!(m.matches("connection refused").count(), 1, "{m}");
        assert!(
            m.starts_with("status: ipmi://a@bmc:623: unreachable"),
            "{m}"
        );
    }
}
