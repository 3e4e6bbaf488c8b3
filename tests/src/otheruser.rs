//! A second, unprivileged user for tests that connect or run as another
//! uid than the daemon's: made once when missing.

use std::process::Command;
use std::sync::OnceLock;

/// The user the tests act as when they need another uid.
pub const USER: &str = "subagent-ci";

/// [`USER`]'s uid and gid, the user made (`useradd --system`) when
/// missing. Needs root.
pub fn ids() -> (u32, u32) {
    static IDS: OnceLock<(u32, u32)> = OnceLock::new();
    *IDS.get_or_init(|| {
        let id = |flag: &str| {
            Command::new("id")
                .args([flag, USER])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .trim()
                        .parse::<u32>()
                        .unwrap()
                })
        };
        if id("-u").is_none() {
            let st = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    USER,
                ])
                .status()
                .unwrap();
            // Another test process may have made it meanwhile.
            assert!(st.success() || id("-u").is_some(), "useradd {USER}");
        }
        (id("-u").unwrap(), id("-g").unwrap())
    })
}

/// [`ids`], or `None` (after `SKIPPED: …`) when not root (`why_root` says
/// what root is needed for) or the host cannot enforce the sandbox.
pub fn ids_or_skip(why_root: &str) -> Option<(u32, u32)> {
    if !crate::runnable(crate::is_root(), "root", why_root) {
        return None;
    }
    for m in crate::missing_mechanisms() {
        if !crate::runnable(false, &m, &format!("this host cannot enforce {m}")) {
            return None;
        }
    }
    Some(ids())
}

/// A root daemon that lets `uid` connect (`allow_uids`, then `extra` in
/// its config; socket 0666, its dir 0755), and the dir of that config.
pub fn daemon_allowing(uid: u32, extra: &str) -> (crate::Daemon, tempfile::TempDir) {
    use std::os::unix::fs::PermissionsExt;
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("c.toml");
    std::fs::write(&cfg, format!("allow_uids = [{uid}]\n{extra}")).unwrap();
    let d = crate::Daemon::start_with(crate::DaemonOpts {
        args: vec!["--config".into(), cfg.display().to_string()],
        ..Default::default()
    });
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    (d, cfg_dir)
}
