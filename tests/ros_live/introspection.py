"""A std_srvs/SetBool server and client with service introspection on (Jazzy's rclpy).

Usage: introspection.py SERVICE COUNT

Both sides publish their events on SERVICE/_service_event (contents included), so each
call makes four events: request sent, request received, response sent, response received.
Waits until ringbag's recorder subscribes to the event topic. Then it makes warm-up calls in
lockstep with the test: after each it prints `warm N` (N calls so far) and reads a line;
`again` makes another, `go` makes COUNT calls and prints `done N` with the number answered.
The warm-up exists because "a subscriber is in the graph" does not prove that the recorder
has matched both of this node's event writers: the test says `go` only once the recorder has
committed more events than one writer alone can have sent.
"""

import sys
import time

import rclpy
from rclpy.qos import qos_profile_system_default
from rclpy.service_introspection import ServiceIntrospectionState
from std_srvs.srv import SetBool


def main():
    service, count = sys.argv[1], int(sys.argv[2])
    rclpy.init()
    node = rclpy.create_node("ringbag_introspection_demo")
    clock = node.get_clock()

    def answer(request, response):
        response.success = request.data
        response.message = "set" if request.data else "unset"
        return response

    server = node.create_service(SetBool, service, answer)
    client = node.create_client(SetBool, service)
    for side in (server, client):
        side.configure_introspection(
            clock, qos_profile_system_default, ServiceIntrospectionState.CONTENTS)
    deadline = time.monotonic() + 20
    events = service.rstrip("/") + "/_service_event"
    while node.count_subscribers(events) == 0 or not client.service_is_ready():
        if time.monotonic() > deadline:
            print("no subscriber on " + events, file=sys.stderr)
            return 1
        rclpy.spin_once(node, timeout_sec=0.05)
    def call(data):
        future = client.call_async(SetBool.Request(data=data))
        rclpy.spin_until_future_complete(node, future, timeout_sec=5)
        return future.result() is not None

    warm = 0
    while True:
        if not call(True):
            print("warm-up call %d unanswered" % (warm + 1), file=sys.stderr)
            return 1
        warm += 1
        print("warm %d" % warm, flush=True)
        word = sys.stdin.readline().strip()
        if word == "go":
            break
        if word != "again":
            print("expected again or go, got %r" % word, file=sys.stderr)
            return 1
    answered = 0
    for i in range(count):
        if call(i % 2 == 0):
            answered += 1
    # Let the last events reach the recorder before the node goes.
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.05)
    print("done %d" % answered, flush=True)
    node.destroy_node()
    rclpy.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
