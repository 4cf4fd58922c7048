//! The ROS service `~/snapshot` (`std_srvs/srv/Trigger`) of the recorder node, as rosbag2's
//! snapshot mode offers it: `ros2 service call /rosbag2_recorder/snapshot std_srvs/srv/Trigger`.
//!
//! The recorder's subscriptions live on their own rcl node; the service gets a small r2r node
//! of its own (`<node>_snapshot`) in its own thread, with the recorder's node name
//! (`--node-name`, default `rosbag2_recorder`) in the service's absolute name, so the name
//! reads as the recorder's `~/snapshot` whatever the recorder is called. Only built
//! against a sourced ROS 2 with std_srvs (`cfg(ringbag_std_srvs)`, set by build.rs): r2r's
//! saved doc-only bindings have no std_srvs.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;
use futures_core::Stream;

use super::snapshotter::Cmd;
use super::trigger::{Origin, Outcome, TriggerRequest};

type Trigger = r2r::std_srvs::srv::Trigger::Service;

/// The service's absolute name: the recorder node's (`node_name`'s) `~/snapshot`.
pub fn service_name(node_name: &str) -> String {
    format!("/{node_name}/snapshot")
}

/// The service thread; stops when dropped or [`RosSnapshotService::stop`]ped.
pub struct RosSnapshotService {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl RosSnapshotService {
    /// Serves `/<node_name>/snapshot`; `node_name` is the recorder's (already checked by
    /// the CLI as an rcl base name, so both names below are valid).
    pub fn start(tx: Sender<Cmd>, node_name: &str) -> Result<RosSnapshotService, String> {
        let name = service_name(node_name);
        let ctx = r2r::Context::create().map_err(|e| format!("ROS context: {e}"))?;
        let mut node = r2r::Node::create(ctx, &format!("{node_name}_snapshot"), "")
            .map_err(|e| format!("ROS node for {name}: {e}"))?;
        let requests = node
            .create_service::<Trigger>(&name, r2r::QosProfile::services_default())
            .map_err(|e| format!("ROS service {name}: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("ringbag-ros-snapshot".into())
                .spawn({
                    let name = name.clone();
                    move || serve(node, requests, &tx, &stop, &name)
                })
                .map_err(|e| e.to_string())?
        };
        log::info!("ROS service {name}: listening for triggers");
        Ok(RosSnapshotService {
            stop,
            handle: Some(handle),
        })
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for RosSnapshotService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn serve(
    mut node: r2r::Node,
    mut requests: impl Stream<Item = r2r::ServiceRequest<Trigger>> + Unpin,
    tx: &Sender<Cmd>,
    stop: &AtomicBool,
    name: &str,
) {
    // r2r hands requests over as a futures Stream; spin_once fills it, so a no-op waker and
    // polling after each spin is all the executor this needs.
    let mut cx = Context::from_waker(Waker::noop());
    while !stop.load(Relaxed) {
        node.spin_once(Duration::from_millis(50));
        while let Poll::Ready(Some(req)) = Pin::new(&mut requests).poll_next(&mut cx) {
            let (rtx, rrx) = crossbeam_channel::bounded(1);
            let sent = tx.send(Cmd::Trigger {
                req: TriggerRequest {
                    reason: Some("ros service".into()),
                    ..Default::default()
                },
                origin: Origin::Service,
                at_ns: None,
                reply: Some(rtx),
                ticket: None,
            });
            let outcome = sent
                .ok()
                .and_then(|_| rrx.recv_timeout(Duration::from_secs(5)).ok());
            let (success, message) = match outcome {
                Some(Outcome::Started { bag }) => (true, format!("snapshot started: {bag}")),
                Some(Outcome::Extended { bag }) => (true, format!("snapshot extended: {bag}")),
                Some(Outcome::RateLimited { suppressed }) => (
                    false,
                    format!("rate-limited ({suppressed} refused in a row)"),
                ),
                Some(Outcome::Refused { why }) => (false, why),
                // Answers to pause/resume, which a trigger never gets; named rather than
                // folded into a wildcard so a new outcome has to be thought about here.
                Some(other @ (Outcome::Paused { .. } | Outcome::Resumed { .. })) => {
                    (false, format!("unexpected answer to a trigger: {other:?}"))
                }
                // The snapshot service is only served with a ring; said plainly all the same.
                Some(Outcome::NoRing) => (false, "this recorder has no black-box ring".into()),
                None => (false, "the recorder is stopping".into()),
            };
            let response = r2r::std_srvs::srv::Trigger::Response { success, message };
            if let Err(e) = req.respond(response) {
                log::warn!("ROS service {name}: cannot respond: {e}");
            }
        }
    }
}
