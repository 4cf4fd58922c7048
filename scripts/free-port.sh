# Sourced by scripts/systemd-test.sh and scripts/powercut-test.sh: both start Garage on a
# port of their own (it needs three).

# free_port: a port P on loopback with P, P+1 and P+3 free (Garage's S3, RPC and admin).
free_port() {
    python3 -c 'import random, socket
for _ in range(200):
    p = random.randrange(20000, 60000)
    try:
        for q in (p, p + 1, p + 3):
            s = socket.socket()
            s.bind(("127.0.0.1", q))
            s.close()
    except OSError:
        continue
    print(p)
    break'
}
