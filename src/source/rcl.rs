//! The recorder's own thin layer over rcl (cargo feature `ros`): one context, one node, raw
//! subscriptions with their message-lost events, and one wait set. Every `unsafe` block of
//! the live source is in this file.
//!
//! Why not r2r's node: its raw subscription takes one message per subscription per
//! `spin_once`, rebuilds an rcl wait set for every `spin_once`, copies each message into a new
//! `Vec` and sends it through a 10-slot channel that drops silently when full. Here the wait
//! set lives as long as the node and is only resized when a subscription is added, and a ready
//! subscription is taken from until rmw says it is empty, into one buffer that rmw grows to
//! the largest message and then reuses. r2r still provides the type support
//! (`WrappedNativeMsgUntyped`) and the QoS conversions; `r2r_rcl` (the same version r2r
//! links) provides the rcl calls.
//!
//! Ownership: [`RclNode`] owns the context, the node, the wait set and every subscription,
//! and tears them down in the order rcl requires (events, subscriptions, wait set, node,
//! context) in `Drop`. Nothing here is shared between threads: the node is created, used and
//! dropped on the source's spin thread.

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::time::Duration;

use r2r_rcl::*;

/// An rcl call that failed: which call, its return code and rcl's error string.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed (rcl code {code}): {message}")]
pub struct RclError {
    pub call: &'static str,
    pub code: i32,
    pub message: String,
}

/// Reads and clears rcl's thread-local error state, so the next failure reports its own.
fn rcl_error(call: &'static str, code: rcl_ret_t) -> RclError {
    // SAFETY: rcutils' error state is thread-local; reading it copies a fixed-size C string
    // out of it (always NUL-terminated by rcutils), and resetting it frees nothing we hold.
    let message = unsafe {
        let e = rcutils_get_error_string();
        let m = CStr::from_ptr(e.str_.as_ptr())
            .to_string_lossy()
            .into_owned();
        rcutils_reset_error();
        m
    };
    RclError {
        call,
        code,
        message,
    }
}

fn check(call: &'static str, ret: rcl_ret_t) -> Result<(), RclError> {
    if ret == RCL_RET_OK as rcl_ret_t {
        Ok(())
    } else {
        Err(rcl_error(call, ret))
    }
}

fn c_string(call: &'static str, s: &str) -> Result<CString, RclError> {
    CString::new(s).map_err(|_| RclError {
        call,
        code: RCL_RET_INVALID_ARGUMENT as i32,
        message: format!("{s:?} contains a NUL byte"),
    })
}

/// Copies a C string owned by rcl into Rust; an unset pointer reads as empty.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that outlives the call.
unsafe fn owned_str(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

fn lookup_error(message: String) -> RclError {
    RclError {
        call: "type support lookup",
        code: RCL_RET_ERROR as i32,
        message,
    }
}

/// The C type support of message type `type_name`, 'static (its library stays loaded).
/// r2r maps the message types sourced when it was built, but leaves everything under `srv/`
/// out of its untyped table, service event messages (`pkg/srv/X_Event`) included: those are
/// looked up in the package's typesupport library, as rosbag2 does.
fn type_support(type_name: &str) -> Result<*const rosidl_message_type_support_t, RclError> {
    if let Some((package, service)) = type_name
        .strip_suffix("_Event")
        .and_then(|s| s.split_once("/srv/"))
    {
        return service_event_type_support(package, service);
    }
    r2r::WrappedNativeMsgUntyped::new_from(type_name)
        .map(|m| m.ts as *const _)
        .map_err(|e| lookup_error(e.to_string()))
}

/// `pkg/srv/X_Event`'s type support: the getter rosidl generates for the event message in
/// `lib<pkg>__rosidl_typesupport_c.so` (found on the sourced environment's library path).
fn service_event_type_support(
    package: &str,
    service: &str,
) -> Result<*const rosidl_message_type_support_t, RclError> {
    generated::<rosidl_message_type_support_t>(
        &format!("lib{package}__rosidl_typesupport_c.so"),
        &format!(
            "rosidl_typesupport_c__get_message_type_support_handle__{package}__srv__{service}_Event"
        ),
    )
}

/// What a rosidl-generated getter `const T * SYMBOL(void)` in `library` returns: the address
/// of a static of that library, which is never unloaded, so the pointer is 'static.
fn generated<T>(library: &str, symbol: &str) -> Result<*const T, RclError> {
    let c_library = c_string("dlopen", library)?;
    let c_symbol = c_string("dlsym", symbol)?;
    let dl_error = |what: &str| {
        // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl call
        // on this thread; it is copied at once.
        let e = unsafe { owned_str(libc::dlerror()) };
        lookup_error(format!("{what}: {e}"))
    };
    // SAFETY: both names are NUL-terminated. The handle is never closed, so the library, and
    // what its getters return, stay valid for the rest of the process.
    let handle = unsafe { libc::dlopen(c_library.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(dl_error("dlopen"));
    }
    // SAFETY: the handle is open (above).
    let getter = unsafe { libc::dlsym(handle, c_symbol.as_ptr()) };
    if getter.is_null() {
        return Err(dl_error("dlsym"));
    }
    // SAFETY: the symbol is a rosidl-generated getter, declared `const T * f(void)`; it only
    // returns a static's address.
    let ts = unsafe {
        let get: unsafe extern "C" fn() -> *const T = std::mem::transmute(getter);
        get()
    };
    if ts.is_null() {
        return Err(lookup_error(format!("{symbol}: returned no type support")));
    }
    Ok(ts)
}

/// One publisher of a topic, as the graph reports it.
pub struct PublisherEndpoint {
    pub qos: r2r::QosProfile,
    /// `RIHS01_<hex>` where the distro reports type hashes (Iron and later), else empty.
    pub type_hash: String,
}

/// Index of a publisher in its [`RclNode`].
pub type PubId = usize;

/// Index of a service client in its [`RclNode`].
pub type ClientId = usize;

/// Which recorded requests `--publish-service-requests` sends: those of REQUEST_RECEIVED
/// events (the server's introspection) or of REQUEST_SENT events (the client's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestsFrom {
    Service,
    Client,
}

/// What became of one recorded service event given to [`RclNode::call`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Sent,
    /// A response, or a request of the other side's introspection: not a call to make.
    NotARequest,
    /// The event was recorded with introspection METADATA only: no request to send.
    NoRequestRecorded,
    /// No server of the service is matched now (rosbag2 drops the request too).
    NoServer,
    /// The recorded bytes are not a valid event of the type (rosbag2 logs and skips it too).
    Undecodable,
}

/// A client of one service, calling it with requests taken out of recorded `X_Event`s.
struct Client {
    /// Boxed: rcl keeps no pointer to it, but its address is handed out per call only.
    handle: Box<rcl_client_t>,
    /// The event message's C type support (rmw_deserialize's) and its introspection.
    event_ts: *const rosidl_message_type_support_t,
    members: &'static rosidl_typesupport_introspection_c__MessageMembers,
    /// The event's C struct, `size_of_` bytes (in u64s, so aligned for any field a ROS
    /// message has), allocated once and reused: init, deserialize, send, fini per event.
    event: Vec<u64>,
}

/// Index of a subscription in its [`RclNode`].
pub type SubId = usize;

struct Subscription {
    handle: Box<rcl_subscription_t>,
    /// The message-lost event, when the rmw supports it.
    lost: Option<Box<rcl_event_t>>,
}

/// What one `wait` found ready, by subscription index. Reused across waits.
#[derive(Default)]
pub struct Ready {
    pub messages: Vec<SubId>,
    pub lost_events: Vec<SubId>,
}

pub struct RclNode {
    context: Box<rcl_context_t>,
    node: Box<rcl_node_t>,
    wait_set: Box<rcl_wait_set_t>,
    /// Sizes the wait set was last (re)sized to; it is resized when subscriptions change.
    wait_subs: usize,
    wait_events: usize,
    subs: Vec<Subscription>,
    /// Publishers of serialized messages (`ringbag play`'s service event topics). Not boxed:
    /// unlike subscriptions, no wait set or event keeps a publisher's address (the handle is
    /// one pointer to rcl's own allocation, which does not move).
    pubs: Vec<rcl_publisher_t>,
    /// Service clients (`ringbag play --publish-service-requests`).
    clients: Vec<Client>,
    /// Where every take lands; rmw grows it to the largest message so far, then reuses it.
    buffer: rcl_serialized_message_t,
    allocator: rcutils_allocator_t,
}

impl RclNode {
    /// A fresh rcl context (no command-line arguments: ringbag's own are not ROS arguments)
    /// and a node named `name`.
    pub fn new(name: &str) -> Result<RclNode, RclError> {
        let c_name = c_string("rcl_node_init", name)?;
        let empty_ns = c_string("rcl_node_init", "")?;
        // SAFETY: the zero-initialised context and options are what rcl_init expects; the
        // options are finalised on every path once rcl_init has copied them.
        let mut context = Box::new(unsafe { rcl_get_zero_initialized_context() });
        let allocator = unsafe { rcutils_get_default_allocator() };
        unsafe {
            let mut options = rcl_get_zero_initialized_init_options();
            check(
                "rcl_init_options_init",
                rcl_init_options_init(&mut options, allocator),
            )?;
            let ret = rcl_init(0, std::ptr::null(), &options, context.as_mut());
            rcl_init_options_fini(&mut options);
            check("rcl_init", ret)?;
        }
        // SAFETY: the context is initialised and boxed, so its address stays fixed for the
        // node, which keeps a pointer to it; both strings outlive the call (rcl copies them).
        let mut node = Box::new(unsafe { rcl_get_zero_initialized_node() });
        let ret = unsafe {
            let options = rcl_node_get_default_options();
            rcl_node_init(
                node.as_mut(),
                c_name.as_ptr(),
                empty_ns.as_ptr(),
                context.as_mut(),
                &options,
            )
        };
        if ret != RCL_RET_OK as rcl_ret_t {
            let e = rcl_error("rcl_node_init", ret);
            // SAFETY: the context was initialised above and nothing else refers to it.
            unsafe {
                rcl_shutdown(context.as_mut());
                rcl_context_fini(context.as_mut());
            }
            return Err(e);
        }
        // SAFETY: a zero wait set of size 0 is valid to initialise against a valid context;
        // it is resized before anything is added.
        let mut wait_set = Box::new(unsafe { rcl_get_zero_initialized_wait_set() });
        let ret = unsafe {
            rcl_wait_set_init(
                wait_set.as_mut(),
                0,
                0,
                0,
                0,
                0,
                0,
                context.as_mut(),
                allocator,
            )
        };
        let mut me = RclNode {
            context,
            node,
            wait_set,
            wait_subs: 0,
            wait_events: 0,
            subs: Vec::new(),
            pubs: Vec::new(),
            clients: Vec::new(),
            // SAFETY: a zero-initialised byte array (null buffer, capacity 0) is a valid
            // target for rcl_take_serialized_message, which allocates it with `allocator`.
            buffer: unsafe { rcutils_get_zero_initialized_uint8_array() },
            allocator,
        };
        me.buffer.allocator = allocator;
        // On failure `me` drops and tears down the node and context.
        check("rcl_wait_set_init", ret)?;
        Ok(me)
    }

    /// Topic names and their types, as the graph knows them now.
    pub fn topic_names_and_types(&self) -> Result<Vec<(String, Vec<String>)>, RclError> {
        let mut allocator = self.allocator;
        // SAFETY: the node is valid; the zero-initialised result is filled by rcl and
        // finalised below on every path after a successful call.
        unsafe {
            let mut nt = rmw_get_zero_initialized_names_and_types();
            check(
                "rcl_get_topic_names_and_types",
                rcl_get_topic_names_and_types(self.node.as_ref(), &mut allocator, false, &mut nt),
            )?;
            let mut out = Vec::with_capacity(nt.names.size);
            for i in 0..nt.names.size {
                let name = owned_str(*nt.names.data.add(i));
                let types = &*nt.types.add(i);
                let types = (0..types.size)
                    .map(|j| owned_str(*types.data.add(j)))
                    .collect();
                out.push((name, types));
            }
            rcl_names_and_types_fini(&mut nt);
            Ok(out)
        }
    }

    /// The publishers of `topic` with the QoS each offers (and, where the distro has them,
    /// the type hash).
    pub fn publishers(&self, topic: &str) -> Result<Vec<PublisherEndpoint>, RclError> {
        let c_topic = c_string("rcl_get_publishers_info_by_topic", topic)?;
        let mut allocator = self.allocator;
        // SAFETY: as in `topic_names_and_types`; the array's entries are read before it is
        // finalised and nothing borrowed from them survives.
        unsafe {
            let mut info = rmw_get_zero_initialized_topic_endpoint_info_array();
            let ret = rcl_get_publishers_info_by_topic(
                self.node.as_ref(),
                &mut allocator,
                c_topic.as_ptr(),
                false,
                &mut info,
            );
            if ret != RCL_RET_OK as rcl_ret_t {
                let e = rcl_error("rcl_get_publishers_info_by_topic", ret);
                rmw_topic_endpoint_info_array_fini(&mut info, &mut allocator);
                return Err(e);
            }
            let mut out = Vec::with_capacity(info.size);
            for i in 0..info.size {
                let e = &*info.info_array.add(i);
                out.push(PublisherEndpoint {
                    qos: r2r::QosProfile::from(e.qos_profile),
                    type_hash: type_hash(e),
                });
            }
            rmw_topic_endpoint_info_array_fini(&mut info, &mut allocator);
            Ok(out)
        }
    }

    /// How many subscriptions the graph knows on `topic`, this node's own included
    /// (`--ignore-leaf-topics` asks before subscribing, as rosbag2's topic filter does).
    pub fn subscriber_count(&self, topic: &str) -> Result<usize, RclError> {
        let c_topic = c_string("rcl_count_subscribers", topic)?;
        let mut count: usize = 0;
        // SAFETY: the node is valid for `self`'s lifetime, `c_topic` outlives the call and
        // `count` is a plain out-parameter rcl writes before returning.
        let ret =
            unsafe { rcl_count_subscribers(self.node.as_ref(), c_topic.as_ptr(), &mut count) };
        check("rcl_count_subscribers", ret)?;
        Ok(count)
    }

    /// Subscribes to `topic` with `qos`, taking raw CDR. The message-lost event is set up
    /// when the rmw supports it (`has_lost_event`).
    /// A publisher of serialized messages of `type_name` on `topic`, for the types r2r's
    /// publishers cannot name (service events: see [`type_support`]).
    pub fn advertise(
        &mut self,
        topic: &str,
        type_name: &str,
        qos: r2r::QosProfile,
    ) -> Result<PubId, RclError> {
        let ts = type_support(type_name)?;
        let c_topic = c_string("rcl_publisher_init", topic)?;
        // SAFETY: the node is valid and outlives the publisher (Drop finalises publishers
        // first); the type support is 'static and rcl copies the topic name.
        let mut handle = unsafe { rcl_get_zero_initialized_publisher() };
        unsafe {
            let mut options = rcl_publisher_get_default_options();
            options.qos = qos.into();
            check(
                "rcl_publisher_init",
                rcl_publisher_init(
                    &mut handle,
                    self.node.as_mut(),
                    ts,
                    c_topic.as_ptr(),
                    &options,
                ),
            )?;
        }
        self.pubs.push(handle);
        Ok(self.pubs.len() - 1)
    }

    /// Publishes CDR bytes (encapsulation header included) on publisher `id`.
    pub fn publish(&self, id: PubId, data: &[u8]) -> Result<(), RclError> {
        let Some(publisher) = self.pubs.get(id) else {
            return Err(RclError {
                call: "rcl_publish_serialized_message",
                code: RCL_RET_PUBLISHER_INVALID as i32,
                message: format!("no publisher {id}"),
            });
        };
        // rcl only reads the bytes, during the call: the array borrows `data` (never
        // resized or freed through the allocator).
        let message = rcl_serialized_message_t {
            buffer: data.as_ptr() as *mut u8,
            buffer_length: data.len(),
            buffer_capacity: data.len(),
            allocator: self.allocator,
        };
        // SAFETY: the publisher was initialised by `advertise` and lives until Drop; the
        // message points to `data`, valid for the call.
        check("rcl_publish_serialized_message", unsafe {
            rcl_publish_serialized_message(publisher, &message, std::ptr::null_mut())
        })
    }

    /// A client of `service` (`/set`) for the recorded events of type `event_type`
    /// (`pkg/srv/X_Event`): the service's C type support for rcl, the event's for rmw to
    /// deserialize into, and its introspection for the layout, each from the package's
    /// generated libraries (as rosbag2's player gets them).
    pub fn service_client(
        &mut self,
        service: &str,
        event_type: &str,
    ) -> Result<ClientId, RclError> {
        let (package, name) = event_type
            .strip_suffix("_Event")
            .and_then(|s| s.split_once("/srv/"))
            .ok_or_else(|| lookup_error(format!("{event_type}: not a service event type")))?;
        let event_ts = service_event_type_support(package, name)?;
        let service_ts = generated::<rosidl_service_type_support_t>(
            &format!("lib{package}__rosidl_typesupport_c.so"),
            &format!(
                "rosidl_typesupport_c__get_service_type_support_handle__{package}__srv__{name}"
            ),
        )?;
        let introspection = generated::<rosidl_message_type_support_t>(
            &format!("lib{package}__rosidl_typesupport_introspection_c.so"),
            &format!(
                "rosidl_typesupport_introspection_c__get_message_type_support_handle__{package}__srv__{name}_Event"
            ),
        )?;
        // SAFETY: an introspection type support's `data` is its MessageMembers, a static of
        // the same never-unloaded library.
        let members = unsafe {
            &*((*introspection).data as *const rosidl_typesupport_introspection_c__MessageMembers)
        };
        // A service event is (info, request[<=1], response[<=1]) in every distro that has
        // them; anything else is not what this reads.
        if members.member_count_ != 3
            || members.init_function.is_none()
            || members.fini_function.is_none()
        {
            return Err(lookup_error(format!(
                "{event_type}: not laid out as a service event (info, request, response)"
            )));
        }
        let c_service = c_string("rcl_client_init", service)?;
        // SAFETY: returns a plain zeroed struct, what rcl_client_init expects.
        let mut handle = Box::new(unsafe { rcl_get_zero_initialized_client() });
        // SAFETY: the node is valid and outlives the client (Drop finalises clients before
        // it); the type support is 'static and rcl copies the name and options.
        unsafe {
            let options = rcl_client_get_default_options();
            check(
                "rcl_client_init",
                rcl_client_init(
                    handle.as_mut(),
                    self.node.as_ref(),
                    service_ts,
                    c_service.as_ptr(),
                    &options,
                ),
            )?;
        }
        let words = members.size_of_.div_ceil(8);
        self.clients.push(Client {
            handle,
            event_ts,
            members,
            event: vec![0u64; words],
        });
        Ok(self.clients.len() - 1)
    }

    /// Calls client `id`'s service with the request in the recorded event `cdr` (a whole
    /// `X_Event` message), when it is a request `from` asks for, as rosbag2's player does:
    /// responses and the other side's requests are skipped, and so is every request while no
    /// server is there. Responses are not waited for (rosbag2 only waits for them at the end).
    pub fn call(&mut self, id: ClientId, cdr: &[u8], from: RequestsFrom) -> Result<Call, RclError> {
        let node = self.node.as_ref() as *const rcl_node_t;
        let allocator = self.allocator;
        let Some(c) = self.clients.get_mut(id) else {
            return Err(RclError {
                call: "rcl_send_request",
                code: RCL_RET_CLIENT_INVALID as i32,
                message: format!("no client {id}"),
            });
        };
        // SAFETY: members_ has member_count_ (3, checked in service_client) entries.
        let (info, request) = unsafe { (&*c.members.members_, &*c.members.members_.add(1)) };
        let message = rcl_serialized_message_t {
            buffer: cdr.as_ptr() as *mut u8,
            buffer_length: cdr.len(),
            buffer_capacity: cdr.len(),
            allocator,
        };
        let event = c.event.as_mut_ptr() as *mut std::os::raw::c_void;
        let (init, fini) = (c.members.init_function, c.members.fini_function);
        // SAFETY: `event` is size_of_ bytes, 8-aligned, and holds no live message: it is
        // initialised here and finalised below on every path, before the next use.
        unsafe {
            init.expect("checked in service_client")(
                event,
                rosidl_runtime_c__message_initialization::ROSIDL_RUNTIME_C_MSG_INIT_ZERO,
            )
        };
        // SAFETY: rmw only reads `cdr` during the call and writes the message `event` is
        // (initialised above, of the type `event_ts` describes).
        let ret = unsafe { rmw_deserialize(&message, c.event_ts, event) };
        let outcome = if ret != RMW_RET_OK as rmw_ret_t {
            // Read (which resets rmw's error state for the next call); the event is skipped.
            log::debug!("{}", rcl_error("rmw_deserialize", ret));
            Ok(Call::Undecodable)
        } else {
            // SAFETY: the info member is a service_msgs/ServiceEventInfo, whose first field
            // is `uint8 event_type`, at the member's offset in the deserialised struct.
            let kind = unsafe { *(event as *const u8).add(info.offset_ as usize) };
            let wanted = match from {
                RequestsFrom::Service => 1, // REQUEST_RECEIVED
                RequestsFrom::Client => 0,  // REQUEST_SENT
            };
            // SAFETY: `request` is the bounded sequence member; its size/get functions take
            // the sequence's address inside the deserialised struct.
            let request_ptr = unsafe {
                let seq =
                    (event as *mut u8).add(request.offset_ as usize) as *mut std::os::raw::c_void;
                match (request.size_function, request.get_function) {
                    (Some(size), Some(get)) if size(seq) > 0 => get(seq, 0),
                    _ => std::ptr::null_mut(),
                }
            };
            if kind != wanted {
                Ok(Call::NotARequest)
            } else {
                let mut available = false;
                // SAFETY: node and client are initialised and live until Drop.
                check("rcl_service_server_is_available", unsafe {
                    rcl_service_server_is_available(node, c.handle.as_ref(), &mut available)
                })
                .and_then(|()| {
                    if !available {
                        return Ok(Call::NoServer);
                    }
                    if request_ptr.is_null() {
                        return Ok(Call::NoRequestRecorded);
                    }
                    let mut sequence = 0i64;
                    // SAFETY: request_ptr is the event's X_Request element, valid until
                    // fini below; rcl serialises it during the call.
                    check("rcl_send_request", unsafe {
                        rcl_send_request(c.handle.as_ref(), request_ptr, &mut sequence)
                    })
                    .map(|()| Call::Sent)
                })
            }
        };
        // SAFETY: `event` was initialised above; fini frees what deserialising allocated.
        unsafe { fini.expect("checked in service_client")(event) };
        outcome
    }

    pub fn subscribe(
        &mut self,
        topic: &str,
        type_name: &str,
        qos: r2r::QosProfile,
    ) -> Result<SubId, RclError> {
        let ts = type_support(type_name)?;
        let c_topic = c_string("rcl_subscription_init", topic)?;
        // SAFETY: the node is valid and outlives the subscription (Drop finalises
        // subscriptions first); the subscription is boxed so its address stays fixed for the
        // wait set and the event, which keep pointers to it.
        let mut handle = Box::new(unsafe { rcl_get_zero_initialized_subscription() });
        unsafe {
            let mut options = rcl_subscription_get_default_options();
            options.qos = qos.into();
            check(
                "rcl_subscription_init",
                rcl_subscription_init(
                    handle.as_mut(),
                    self.node.as_mut(),
                    ts,
                    c_topic.as_ptr(),
                    &options,
                ),
            )?;
        }
        // SAFETY: the subscription was just initialised; the event is boxed (the wait set
        // keeps its address) and finalised before the subscription in Drop.
        let mut event = Box::new(unsafe { rcl_get_zero_initialized_event() });
        let ret = unsafe {
            rcl_subscription_event_init(
                event.as_mut(),
                handle.as_ref(),
                rcl_subscription_event_type_t::RCL_SUBSCRIPTION_MESSAGE_LOST,
            )
        };
        let lost = if ret == RCL_RET_OK as rcl_ret_t {
            Some(event)
        } else {
            let e = rcl_error("rcl_subscription_event_init", ret);
            log::info!("{topic}: the middleware reports no message-lost event ({e})");
            None
        };
        self.subs.push(Subscription { handle, lost });
        self.resize_wait_set()?;
        Ok(self.subs.len() - 1)
    }

    pub fn has_lost_event(&self, sub: SubId) -> bool {
        self.subs.get(sub).is_some_and(|s| s.lost.is_some())
    }

    /// Resized only when a subscription was added: the per-wait work is then only clearing
    /// and re-adding pointers, which allocates nothing.
    fn resize_wait_set(&mut self) -> Result<(), RclError> {
        let subs = self.subs.len();
        let events = self.subs.iter().filter(|s| s.lost.is_some()).count();
        if (subs, events) == (self.wait_subs, self.wait_events) {
            return Ok(());
        }
        // SAFETY: the wait set was initialised in `new`; resizing frees its pointer arrays,
        // which hold nothing of ours between waits.
        check("rcl_wait_set_resize", unsafe {
            rcl_wait_set_resize(self.wait_set.as_mut(), subs, 0, 0, 0, 0, events)
        })?;
        self.wait_subs = subs;
        self.wait_events = events;
        Ok(())
    }

    /// Waits up to `timeout` for a message or a message-lost event; fills `ready`.
    /// With no subscriptions it only sleeps (rcl_wait returns at once on an empty set).
    pub fn wait(&mut self, timeout: Duration, ready: &mut Ready) -> Result<(), RclError> {
        ready.messages.clear();
        ready.lost_events.clear();
        if self.subs.is_empty() {
            std::thread::sleep(timeout);
            return Ok(());
        }
        let ws = self.wait_set.as_mut();
        // SAFETY: the wait set is sized for every subscription and event (resize_wait_set),
        // and every pointer added is to a boxed, initialised handle that outlives the wait.
        unsafe {
            check("rcl_wait_set_clear", rcl_wait_set_clear(ws))?;
            for s in &self.subs {
                check(
                    "rcl_wait_set_add_subscription",
                    rcl_wait_set_add_subscription(ws, s.handle.as_ref(), std::ptr::null_mut()),
                )?;
                if let Some(e) = &s.lost {
                    check(
                        "rcl_wait_set_add_event",
                        rcl_wait_set_add_event(ws, e.as_ref(), std::ptr::null_mut()),
                    )?;
                }
            }
        }
        let ns = i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX);
        // SAFETY: the wait set is valid and filled above.
        let ret = unsafe { rcl_wait(ws, ns) };
        if ret == RCL_RET_TIMEOUT as rcl_ret_t {
            return Ok(());
        }
        check("rcl_wait", ret)?;
        // rcl_wait nulls the entries that are not ready; entries keep the order they were
        // added in, which is the order of `subs` (events: of the subs that have one).
        let mut event_slot = 0;
        for (i, s) in self.subs.iter().enumerate() {
            // SAFETY: i < size_of_subscriptions (= subs.len()), and event_slot stays below
            // size_of_events (= number of subs with an event), as sized by resize_wait_set.
            unsafe {
                if !(*ws.subscriptions.add(i)).is_null() {
                    ready.messages.push(i);
                }
                if s.lost.is_some() {
                    if !(*ws.events.add(event_slot)).is_null() {
                        ready.lost_events.push(i);
                    }
                    event_slot += 1;
                }
            }
        }
        Ok(())
    }

    /// Takes the next serialized message of `sub`, or `None` when its queue is empty. The
    /// bytes are valid until the next take.
    pub fn take(&mut self, sub: SubId) -> Result<Option<&[u8]>, RclError> {
        let Some(s) = self.subs.get(sub) else {
            return Ok(None);
        };
        let mut info = rmw_message_info_t::default();
        // SAFETY: the subscription is valid; rmw writes into `buffer`, growing it with the
        // allocator it carries when the message is larger than its capacity.
        let ret = unsafe {
            rcl_take_serialized_message(
                s.handle.as_ref(),
                &mut self.buffer,
                &mut info,
                std::ptr::null_mut(),
            )
        };
        if ret == RCL_RET_SUBSCRIPTION_TAKE_FAILED as rcl_ret_t {
            return Ok(None);
        }
        check("rcl_take_serialized_message", ret)?;
        if self.buffer.buffer.is_null() || self.buffer.buffer_length == 0 {
            return Ok(Some(&[]));
        }
        // SAFETY: after a successful take, `buffer` holds `buffer_length` initialised bytes;
        // the slice borrows `self`, so no take can overwrite it while it is alive.
        Ok(Some(unsafe {
            std::slice::from_raw_parts(self.buffer.buffer, self.buffer.buffer_length)
        }))
    }

    /// Messages the middleware reports lost on `sub` since the last call (0 without the
    /// event).
    pub fn take_lost(&mut self, sub: SubId) -> Result<u64, RclError> {
        let Some(event) = self.subs.get(sub).and_then(|s| s.lost.as_ref()) else {
            return Ok(0);
        };
        let mut status = rmw_message_lost_status_t {
            total_count: 0,
            total_count_change: 0,
        };
        // SAFETY: the event is a valid MESSAGE_LOST event, whose payload type is
        // rmw_message_lost_status_t.
        let ret = unsafe {
            rcl_take_event(
                event.as_ref(),
                (&mut status as *mut rmw_message_lost_status_t).cast(),
            )
        };
        if ret == RCL_RET_EVENT_TAKE_FAILED as rcl_ret_t {
            return Ok(0);
        }
        check("rcl_take_event", ret)?;
        Ok(status.total_count_change as u64)
    }
}

impl Drop for RclNode {
    fn drop(&mut self) {
        // Errors here cannot be acted on; rcl's messages are logged so a leak is visible.
        let log = |call: &'static str, ret: rcl_ret_t| {
            if ret != RCL_RET_OK as rcl_ret_t {
                log::debug!("{}", rcl_error(call, ret));
            }
        };
        // SAFETY: teardown in rcl's order (clients, publishers, events, subscriptions, wait set, buffer, node,
        // context); each handle was initialised and is finalised exactly once here.
        unsafe {
            for c in &mut self.clients {
                log(
                    "rcl_client_fini",
                    rcl_client_fini(c.handle.as_mut(), self.node.as_mut()),
                );
            }
            for p in &mut self.pubs {
                log(
                    "rcl_publisher_fini",
                    rcl_publisher_fini(p, self.node.as_mut()),
                );
            }
            for s in &mut self.subs {
                if let Some(e) = s.lost.as_mut() {
                    log("rcl_event_fini", rcl_event_fini(e.as_mut()));
                }
                log(
                    "rcl_subscription_fini",
                    rcl_subscription_fini(s.handle.as_mut(), self.node.as_mut()),
                );
            }
            log(
                "rcl_wait_set_fini",
                rcl_wait_set_fini(self.wait_set.as_mut()),
            );
            if !self.buffer.buffer.is_null() {
                rcutils_uint8_array_fini(&mut self.buffer);
            }
            log("rcl_node_fini", rcl_node_fini(self.node.as_mut()));
            log("rcl_shutdown", rcl_shutdown(self.context.as_mut()));
            log("rcl_context_fini", rcl_context_fini(self.context.as_mut()));
        }
    }
}

/// The endpoint's type hash as rosbag2 writes it (`RIHS01_<64 hex>`), on distros whose rmw
/// reports one; `ringbag_rmw_type_hash` is set by build.rs from `ROS_DISTRO`.
#[cfg(ringbag_rmw_type_hash)]
fn type_hash(e: &rmw_topic_endpoint_info_t) -> String {
    let h = &e.topic_type_hash;
    if h.version == 0 {
        return String::new();
    }
    let mut s = format!("RIHS{:02}_", h.version);
    for b in h.value {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Humble's endpoint info has no type hash; rosbag2 Humble writes none either.
#[cfg(not(ringbag_rmw_type_hash))]
fn type_hash(_e: &rmw_topic_endpoint_info_t) -> String {
    String::new()
}
