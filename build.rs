//! Build-time facts: what `ringbag --version` reports, and what the `ros` feature needs from the
//! sourced ROS 2 distro.

use std::path::Path;
use std::process::Command;

fn main() {
    version_facts();
    ros_facts();
}

/// `ringbag --version` names the commit and the features, so a binary found on a robot can be
/// traced to its source and to whether it can record live ROS 2 at all.
fn version_facts() {
    let commit = match std::env::var("RINGBAG_GIT_COMMIT") {
        // Builds from a source tree without .git (a Yocto or release tarball) pass it in;
        // scripts/build-release.sh passes it with a `-dirty` mark for an uncommitted tree.
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => git_commit().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rerun-if-env-changed=RINGBAG_GIT_COMMIT");
    let features = if std::env::var_os("CARGO_FEATURE_ROS").is_some() {
        match std::env::var("ROS_DISTRO") {
            Ok(d) if !d.is_empty() => format!("ros ({d})"),
            _ => "ros".to_string(),
        }
    } else {
        "none".to_string()
    };
    let target = std::env::var("TARGET").unwrap_or_default();
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!(
        "cargo:rustc-env=RINGBAG_LONG_VERSION={version} (commit {commit}, features: {features}, target {target})"
    );
    // The same facts one by one, for the `ringbag_build_info` metric's labels.
    println!("cargo:rustc-env=RINGBAG_BUILD_COMMIT={commit}");
    println!("cargo:rustc-env=RINGBAG_BUILD_FEATURES={features}");
    println!("cargo:rustc-env=RINGBAG_BUILD_TARGET={target}");
}

/// The commit of the source tree, when it is a git checkout with git installed. Rebuilds when
/// HEAD moves (a commit, a checkout), not on every edit: a dirty mark is the release script's job.
fn git_commit() -> Option<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .args(args)
            .current_dir(&dir)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // --git-path resolves worktrees and the common dir. Only paths that exist are watched:
    // cargo counts a missing one as changed on every build, which rebuilt the crate each
    // time in a checkout without packed-refs. A ref that moves between the loose file and
    // packed-refs (`git pack-refs`) removes a watched file, which reruns this and re-picks.
    let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(r);
    }
    for w in watch {
        if let Some(p) = git(&["rev-parse", "--git-path", &w]) {
            let p = Path::new(&dir).join(p);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    Some(commit)
}

fn ros_facts() {
    println!("cargo:rustc-check-cfg=cfg(ringbag_rmw_type_hash)");
    println!("cargo:rustc-check-cfg=cfg(ringbag_service_introspection)");
    println!("cargo:rerun-if-env-changed=ROS_DISTRO");
    // rmw reports an endpoint's type hash from Iron on (Humble's struct has no such field).
    // Without a sourced distro (CI's `r2r/doc-only` check) the Humble layout is assumed,
    // which is also the layout of r2r_rcl's saved doc-only bindings: run that check with
    // ROS_DISTRO unset (scripts/test.sh does) even in a shell where Jazzy is sourced.
    println!("cargo:rustc-check-cfg=cfg(ringbag_std_srvs)");
    println!("cargo:rustc-check-cfg=cfg(ringbag_rosbag2_iface)");
    println!("cargo:rustc-check-cfg=cfg(ringbag_split_bagfile)");
    println!("cargo:rustc-check-cfg=cfg(ringbag_split_event_node_name)");
    println!("cargo:rerun-if-env-changed=AMENT_PREFIX_PATH");
    if std::env::var_os("CARGO_FEATURE_ROS").is_some() {
        let distro = std::env::var("ROS_DISTRO").unwrap_or_default();
        if matches!(distro.as_str(), "iron" | "jazzy" | "kilted" | "rolling") {
            println!("cargo:rustc-cfg=ringbag_rmw_type_hash");
            // Service introspection (`<service>/_service_event`) also arrived in Iron.
            println!("cargo:rustc-cfg=ringbag_service_introspection");
        }
        // The snapshot service `~/snapshot` needs std_srvs, which r2r generates only from a
        // sourced distro (its doc-only bindings lack it): same rule as above, a distro set.
        let has_std_srvs = std::env::var_os("AMENT_PREFIX_PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("share/std_srvs").is_dir()));
        if !distro.is_empty() && has_std_srvs {
            println!("cargo:rustc-cfg=ringbag_std_srvs");
        }
        // The recorder's ROS interface (`~/pause`, `events/write_split`, ...) needs
        // rosbag2_interfaces, likewise only from a sourced distro. What it holds differs:
        // `SplitBagfile` and the split event's `node_name` came with Iron, so each is looked
        // for in the installed interface files themselves, not inferred from the distro name.
        let share = |rel: &str| {
            std::env::var_os("AMENT_PREFIX_PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("share/rosbag2_interfaces").join(rel))
                    .find(|f| f.is_file())
            })
        };
        if let Some(event) = share("msg/WriteSplitEvent.msg").filter(|_| !distro.is_empty()) {
            println!("cargo:rustc-cfg=ringbag_rosbag2_iface");
            if share("srv/SplitBagfile.srv").is_some() {
                println!("cargo:rustc-cfg=ringbag_split_bagfile");
            }
            let text = std::fs::read_to_string(&event).unwrap_or_default();
            if text
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some("node_name"))
            {
                println!("cargo:rustc-cfg=ringbag_split_event_node_name");
            }
        }
    }
}
