"""A pyghmi BMC (the base of virtualbmc) for palisade-fence's tests.

Usage: pyghmi_bmc.py PORT USER PASSWORD
Listens on 127.0.0.1:PORT, keeps the chassis power in memory (on at start) and prints
"ready" once the socket is bound. pyghmi keeps one session per client address and port,
never expires it, and answers Open Session with suite 3's algorithms whatever is asked.
"""

import sys

import pyghmi.ipmi.bmc as bmc


class MemoryBmc(bmc.Bmc):
    def __init__(self, authdata, port):
        super().__init__(authdata, port=port, address="127.0.0.1")
        self.power = "on"

    def get_power_state(self):
        return self.power

    def power_off(self):
        self.power = "off"

    def power_on(self):
        self.power = "on"

    def power_cycle(self):
        self.power = "on"

    def power_reset(self):
        pass

    def power_shutdown(self):
        self.power = "off"


def main():
    port, user, password = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    server = MemoryBmc({user: password}, port)
    print("ready", flush=True)
    server.listen()


if __name__ == "__main__":
    main()
