"""A plain std_srvs/SetBool server (no introspection) that logs every request it gets.

Usage: setbool_server.py SERVICE LOG

Appends one line per request to LOG, `1` or `0` (the request's `data`), flushed at once, so
a test can poll LOG for the requests a player sent. Exits 0 on SIGINT or SIGTERM.
"""

import signal
import sys

import rclpy
from rclpy.executors import ExternalShutdownException
from std_srvs.srv import SetBool


def main():
    service, log_path = sys.argv[1], sys.argv[2]
    rclpy.init()
    # SIGTERM as SIGINT: a clean shutdown either way, so the test's kill is not an error.
    signal.signal(signal.SIGTERM, lambda *_: rclpy.try_shutdown())
    node = rclpy.create_node("ringbag_setbool_server")
    log = open(log_path, "a", buffering=1)

    def answer(request, response):
        log.write("1\n" if request.data else "0\n")
        log.flush()
        response.success = True
        response.message = "logged"
        return response

    node.create_service(SetBool, service, answer)
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
