//! Build-time facts the `ros` feature needs from the sourced ROS 2 distro.

fn main() {
    println!("cargo:rustc-check-cfg=cfg(ringbag_rmw_type_hash)");
    println!("cargo:rerun-if-env-changed=ROS_DISTRO");
    // rmw reports an endpoint's type hash from Iron on (Humble's struct has no such field).
    // Without a sourced distro (CI's `r2r/doc-only` check) the Humble layout is assumed,
    // which is also the layout of r2r_rcl's saved doc-only bindings: run that check with
    // ROS_DISTRO unset (scripts/test.sh does) even in a shell where Jazzy is sourced.
    if std::env::var_os("CARGO_FEATURE_ROS").is_some() {
        let distro = std::env::var("ROS_DISTRO").unwrap_or_default();
        if matches!(distro.as_str(), "iron" | "jazzy" | "kilted" | "rolling") {
            println!("cargo:rustc-cfg=ringbag_rmw_type_hash");
        }
    }
}
