//! The recorder's ROS interface that fleet tools drive, as `ros2 bag record` serves it:
//! the services `~/pause`, `~/resume`, `~/is_paused` and (from Iron on) `~/split_bagfile`
//! (`rosbag2_interfaces/srv/*`), and the topic `events/write_split`
//! (`rosbag2_interfaces/msg/WriteSplitEvent`).
//!
//! Like `~/snapshot` ([`crate::snapshot::ros_service`]) it runs on a small r2r node of its
//! own (`<node>_interface`) in its own thread, with the recorder's node name in each
//! service's absolute name (`/<node>/pause`), so the names are the ones rosbag2 exposes
//! whatever the recorder is called. Nothing here waits on the writer: pause and resume flip
//! the [`PauseSwitch`] the writer reads once per batch; a split is two relaxed stores the
//! writer takes at its next turn ([`Progress::request_rotate`]); split events come from the
//! writer over a bounded queue ([`SplitEventReceiver`]) this thread drains after each spin.
//! Only built against a sourced distro with rosbag2_interfaces (`cfg(ringbag_rosbag2_iface)`,
//! set by build.rs): r2r's saved doc-only bindings have none, and Humble's have no
//! `SplitBagfile` (`cfg(ringbag_split_bagfile)`) nor the event's `node_name`.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use futures_core::Stream;
use r2r::rosbag2_interfaces::{msg::WriteSplitEvent, srv};

use crate::pipeline::{PauseSwitch, Progress, SplitEventReceiver};

/// rosbag2's topic name, relative: the recorder's node has no namespace, so it reads as
/// `/events/write_split`.
pub const WRITE_SPLIT_TOPIC: &str = "events/write_split";

/// The absolute name of the recorder node's (`node_name`'s) `~/<service>`.
pub fn service_name(node_name: &str, service: &str) -> String {
    format!("/{node_name}/{service}")
}

/// The interface thread; stops when dropped or [`RosInterface::stop`]ped, after publishing
/// the split events still queued (the final close's among them).
pub struct RosInterface {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

type Requests<S> = Pin<Box<dyn Stream<Item = r2r::ServiceRequest<S>> + Send>>;

struct Served {
    node: r2r::Node,
    pause: Requests<srv::Pause::Service>,
    resume: Requests<srv::Resume::Service>,
    is_paused: Requests<srv::IsPaused::Service>,
    #[cfg(ringbag_split_bagfile)]
    split: Requests<srv::SplitBagfile::Service>,
    events: r2r::Publisher<WriteSplitEvent>,
}

impl RosInterface {
    /// Serves the recorder node `node_name`'s services and publishes its split events
    /// (`node_name` already checked by the CLI as an rcl base name).
    pub fn start(
        node_name: &str,
        pause: Arc<PauseSwitch>,
        progress: Arc<Progress>,
        events: SplitEventReceiver,
    ) -> Result<RosInterface, String> {
        let ctx = r2r::Context::create().map_err(|e| format!("ROS context: {e}"))?;
        let mut node = r2r::Node::create(ctx, &format!("{node_name}_interface"), "")
            .map_err(|e| format!("ROS node for /{node_name}'s services: {e}"))?;
        let qos = r2r::QosProfile::services_default;
        let name = |s: &str| service_name(node_name, s);
        let service_err = |s: &str, e: r2r::Error| format!("ROS service {}: {e}", name(s));
        let pause_rq = node
            .create_service::<srv::Pause::Service>(&name("pause"), qos())
            .map_err(|e| service_err("pause", e))?;
        let resume_rq = node
            .create_service::<srv::Resume::Service>(&name("resume"), qos())
            .map_err(|e| service_err("resume", e))?;
        let is_paused_rq = node
            .create_service::<srv::IsPaused::Service>(&name("is_paused"), qos())
            .map_err(|e| service_err("is_paused", e))?;
        #[cfg(ringbag_split_bagfile)]
        let split_rq = node
            .create_service::<srv::SplitBagfile::Service>(&name("split_bagfile"), qos())
            .map_err(|e| service_err("split_bagfile", e))?;
        // rosbag2: `create_publisher<WriteSplitEvent>("events/write_split", 1)`, i.e.
        // keep-last 1, reliable, volatile.
        let publisher = node
            .create_publisher::<WriteSplitEvent>(
                WRITE_SPLIT_TOPIC,
                r2r::QosProfile::default().keep_last(1),
            )
            .map_err(|e| format!("ROS publisher /{WRITE_SPLIT_TOPIC}: {e}"))?;
        let served = Served {
            node,
            pause: Box::pin(pause_rq),
            resume: Box::pin(resume_rq),
            is_paused: Box::pin(is_paused_rq),
            #[cfg(ringbag_split_bagfile)]
            split: Box::pin(split_rq),
            events: publisher,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = stop.clone();
            let fq_name = format!("/{node_name}");
            std::thread::Builder::new()
                .name("ringbag-ros-iface".into())
                .spawn(move || serve(served, &pause, &progress, &events, &stop, &fq_name))
                .map_err(|e| e.to_string())?
        };
        let split = if cfg!(ringbag_split_bagfile) {
            ", split_bagfile"
        } else {
            ""
        };
        log::info!(
            "ROS services /{node_name}/pause, resume, is_paused{split}: listening; \
             split events on /{WRITE_SPLIT_TOPIC}"
        );
        Ok(RosInterface {
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

impl Drop for RosInterface {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Every request waiting on `requests`, each answered by `answer`.
fn answer_all<S: r2r::WrappedServiceTypeSupport + 'static>(
    requests: &mut Requests<S>,
    cx: &mut Context<'_>,
    mut answer: impl FnMut() -> S::Response,
) {
    while let Poll::Ready(Some(req)) = requests.as_mut().poll_next(cx) {
        if let Err(e) = req.respond(answer()) {
            log::warn!("ROS service: cannot respond: {e}");
        }
    }
}

fn serve(
    mut s: Served,
    pause: &PauseSwitch,
    progress: &Progress,
    events: &SplitEventReceiver,
    stop: &AtomicBool,
    fq_name: &str,
) {
    // r2r hands requests over as futures Streams that spin_once fills: a no-op waker and a
    // poll after each spin is all the executor this needs (as `~/snapshot`).
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        // Checked before the last drain: events queued before the stop are still sent.
        let stopping = stop.load(Relaxed);
        s.node.spin_once(Duration::from_millis(20));
        answer_all(&mut s.pause, &mut cx, || {
            pause.set(true, "ROS service ~/pause");
            srv::Pause::Response {}
        });
        answer_all(&mut s.resume, &mut cx, || {
            pause.set(false, "ROS service ~/resume");
            srv::Resume::Response {}
        });
        answer_all(&mut s.is_paused, &mut cx, || srv::IsPaused::Response {
            paused: pause.is_paused(),
        });
        #[cfg(ringbag_split_bagfile)]
        answer_all(&mut s.split, &mut cx, || {
            // rosbag2 splits even a split that holds nothing yet; the writer closes it at
            // its next turn, after writing what was accepted before the request.
            log::info!("ROS service ~/split_bagfile: closing the current split");
            progress.request_rotate();
            srv::SplitBagfile::Response {}
        });
        #[cfg(not(ringbag_split_bagfile))]
        let _ = progress;
        while let Some(e) = events.try_recv() {
            // Humble's message has no `node_name` (build.rs reads the installed .msg).
            #[cfg(ringbag_split_event_node_name)]
            let msg = WriteSplitEvent {
                closed_file: e.closed_file,
                opened_file: e.opened_file,
                node_name: fq_name.to_string(),
            };
            #[cfg(not(ringbag_split_event_node_name))]
            let msg = WriteSplitEvent {
                closed_file: e.closed_file,
                opened_file: e.opened_file,
            };
            if let Err(err) = s.events.publish(&msg) {
                log::warn!("cannot publish on /{WRITE_SPLIT_TOPIC}: {err}");
            }
        }
        if stopping {
            break;
        }
    }
    #[cfg(not(ringbag_split_event_node_name))]
    let _ = fq_name;
    if events.dropped() > 0 {
        log::warn!(
            "/{WRITE_SPLIT_TOPIC}: {} split events dropped (the ROS side fell behind)",
            events.dropped()
        );
    }
}
