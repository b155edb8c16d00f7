#!/usr/bin/python3
# interop/imm_peer.py ADDR PORT: an rdma_cm server written against
# rdma-core's own Python binding (pyverbs), not goverbs. It accepts one
# connection, takes one Send with immediate data and prints the number
# the C API gives for it, ntohl(wc.imm_data), and the message, so that
# interop/ibverbs.sh can check that a goverbs SendWR.Imm arrives as the
# same number at a peer that is not goverbs. Exit status 0 when a
# receive completed successfully with immediate data.
import socket
import sys

import pyverbs.cm_enums as ce
import pyverbs.enums as e
from pyverbs.cmid import CMID, AddrInfo
from pyverbs.qp import QPCap, QPInitAttr


def main():
    addr, port = sys.argv[1], sys.argv[2]
    info = AddrInfo(src=addr, src_service=port, port_space=ce.RDMA_PS_TCP, flags=ce.RAI_PASSIVE)
    attr = QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(max_send_wr=1, max_recv_wr=1))
    listener = CMID(creator=info, qp_init_attr=attr)
    listener.listen()
    print("listening", flush=True)
    conn = listener.get_request()
    mr = conn.reg_msgs(64)
    conn.post_recv(mr, 64)
    conn.accept()
    wc = None
    while wc is None:
        wc = conn.get_recv_comp()
    if wc.status != e.IBV_WC_SUCCESS or not wc.wc_flags & e.IBV_WC_WITH_IMM:
        print("receive status %d, flags %#x: no immediate data" % (wc.status, wc.wc_flags))
        return 1
    msg = mr.read(wc.byte_len, 0).decode(errors="replace")
    # pyverbs gives wc.imm_data as the C struct holds it: network order.
    print("imm %#010x message %r (imm_data as stored %#010x)" % (socket.ntohl(wc.imm_data), msg, wc.imm_data), flush=True)
    conn.disconnect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
