//go:build cgo

package ibverbs

import (
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/provider/ibverbs/internal/cheader"
	"github.com/goverbs/goverbs/verbs/driver"
)

// TestLayoutMatchesHeaders checks every C structure, field offset and
// constant the provider declares in Go against <infiniband/verbs.h> and
// <rdma/rdma_cma.h>, as the C compiler lays them out.
func TestLayoutMatchesHeaders(t *testing.T) {
	var (
		sge  ibvSGE
		swr  ibvSendWR
		rwr  ibvRecvWR
		wc   ibvWC
		qc   ibvQPCap
		qia  ibvQPInitAttr
		gr   ibvGlobalRoute
		ah   ibvAHAttr
		qa   ibvQPAttr
		sa   ibvSRQAttr
		sia  ibvSRQInitAttr
		ae   ibvAsyncEvent
		da   ibvDeviceAttr
		pa   ibvPortAttr
		cp   rdmaConnParam
		dsge driver.SGE
	)
	want := map[string]uintptr{
		"sizeof ibv_sge": unsafe.Sizeof(sge), "ibv_sge.addr": unsafe.Offsetof(sge.addr),
		"ibv_sge.length": unsafe.Offsetof(sge.length), "ibv_sge.lkey": unsafe.Offsetof(sge.lkey),

		"sizeof ibv_send_wr": unsafe.Sizeof(swr), "ibv_send_wr.wr_id": unsafe.Offsetof(swr.wrID),
		"ibv_send_wr.next": unsafe.Offsetof(swr.next), "ibv_send_wr.sg_list": unsafe.Offsetof(swr.sgList),
		"ibv_send_wr.num_sge": unsafe.Offsetof(swr.numSGE), "ibv_send_wr.opcode": unsafe.Offsetof(swr.opcode),
		"ibv_send_wr.send_flags": unsafe.Offsetof(swr.sendFlags), "ibv_send_wr.imm_data": unsafe.Offsetof(swr.immData),
		"ibv_send_wr.invalidate_rkey":       unsafe.Offsetof(swr.immData),
		"ibv_send_wr.wr.rdma.remote_addr":   unsafe.Offsetof(swr.remoteAddr),
		"ibv_send_wr.wr.rdma.rkey":          unsafe.Offsetof(swr.compareAdd),
		"ibv_send_wr.wr.atomic.remote_addr": unsafe.Offsetof(swr.remoteAddr),
		"ibv_send_wr.wr.atomic.compare_add": unsafe.Offsetof(swr.compareAdd),
		"ibv_send_wr.wr.atomic.swap":        unsafe.Offsetof(swr.swap),
		"ibv_send_wr.wr.atomic.rkey":        unsafe.Offsetof(swr.atomicRKey),
		"ibv_send_wr.qp_type":               unsafe.Offsetof(swr.qpType),
		"ibv_send_wr.bind_mw":               unsafe.Offsetof(swr.bindMW),

		"sizeof ibv_recv_wr": unsafe.Sizeof(rwr), "ibv_recv_wr.wr_id": unsafe.Offsetof(rwr.wrID),
		"ibv_recv_wr.next": unsafe.Offsetof(rwr.next), "ibv_recv_wr.sg_list": unsafe.Offsetof(rwr.sgList),
		"ibv_recv_wr.num_sge": unsafe.Offsetof(rwr.numSGE),

		"sizeof ibv_wc": unsafe.Sizeof(wc), "ibv_wc.wr_id": unsafe.Offsetof(wc.wrID),
		"ibv_wc.status": unsafe.Offsetof(wc.status), "ibv_wc.opcode": unsafe.Offsetof(wc.opcode),
		"ibv_wc.vendor_err": unsafe.Offsetof(wc.vendorErr), "ibv_wc.byte_len": unsafe.Offsetof(wc.byteLen),
		"ibv_wc.imm_data": unsafe.Offsetof(wc.immData), "ibv_wc.qp_num": unsafe.Offsetof(wc.qpNum),
		"ibv_wc.src_qp": unsafe.Offsetof(wc.srcQP), "ibv_wc.wc_flags": unsafe.Offsetof(wc.wcFlags),
		"ibv_wc.pkey_index": unsafe.Offsetof(wc.pkeyIndex), "ibv_wc.slid": unsafe.Offsetof(wc.slid),
		"ibv_wc.sl": unsafe.Offsetof(wc.sl), "ibv_wc.dlid_path_bits": unsafe.Offsetof(wc.dlidPathBits),

		"sizeof ibv_qp_cap": unsafe.Sizeof(qc), "ibv_qp_cap.max_send_wr": unsafe.Offsetof(qc.maxSendWR),
		"ibv_qp_cap.max_recv_wr": unsafe.Offsetof(qc.maxRecvWR), "ibv_qp_cap.max_send_sge": unsafe.Offsetof(qc.maxSendSGE),
		"ibv_qp_cap.max_recv_sge": unsafe.Offsetof(qc.maxRecvSGE), "ibv_qp_cap.max_inline_data": unsafe.Offsetof(qc.maxInlineData),

		"sizeof ibv_qp_init_attr": unsafe.Sizeof(qia), "ibv_qp_init_attr.qp_context": unsafe.Offsetof(qia.qpContext),
		"ibv_qp_init_attr.send_cq": unsafe.Offsetof(qia.sendCQ), "ibv_qp_init_attr.recv_cq": unsafe.Offsetof(qia.recvCQ),
		"ibv_qp_init_attr.srq": unsafe.Offsetof(qia.srq), "ibv_qp_init_attr.cap": unsafe.Offsetof(qia.cap),
		"ibv_qp_init_attr.qp_type": unsafe.Offsetof(qia.qpType), "ibv_qp_init_attr.sq_sig_all": unsafe.Offsetof(qia.sqSigAll),

		"sizeof ibv_global_route": unsafe.Sizeof(gr), "ibv_global_route.dgid": unsafe.Offsetof(gr.dgid),
		"ibv_global_route.flow_label": unsafe.Offsetof(gr.flowLabel), "ibv_global_route.sgid_index": unsafe.Offsetof(gr.sgidIndex),
		"ibv_global_route.hop_limit": unsafe.Offsetof(gr.hopLimit), "ibv_global_route.traffic_class": unsafe.Offsetof(gr.trafficClass),

		"sizeof ibv_ah_attr": unsafe.Sizeof(ah), "ibv_ah_attr.grh": unsafe.Offsetof(ah.grh),
		"ibv_ah_attr.dlid": unsafe.Offsetof(ah.dlid), "ibv_ah_attr.sl": unsafe.Offsetof(ah.sl),
		"ibv_ah_attr.src_path_bits": unsafe.Offsetof(ah.srcPathBits), "ibv_ah_attr.static_rate": unsafe.Offsetof(ah.staticRate),
		"ibv_ah_attr.is_global": unsafe.Offsetof(ah.isGlobal), "ibv_ah_attr.port_num": unsafe.Offsetof(ah.portNum),

		"sizeof ibv_qp_attr": unsafe.Sizeof(qa), "ibv_qp_attr.qp_state": unsafe.Offsetof(qa.qpState),
		"ibv_qp_attr.cur_qp_state": unsafe.Offsetof(qa.curQPState), "ibv_qp_attr.path_mtu": unsafe.Offsetof(qa.pathMTU),
		"ibv_qp_attr.path_mig_state": unsafe.Offsetof(qa.pathMigState), "ibv_qp_attr.qkey": unsafe.Offsetof(qa.qkey),
		"ibv_qp_attr.rq_psn": unsafe.Offsetof(qa.rqPSN), "ibv_qp_attr.sq_psn": unsafe.Offsetof(qa.sqPSN),
		"ibv_qp_attr.dest_qp_num": unsafe.Offsetof(qa.destQPNum), "ibv_qp_attr.qp_access_flags": unsafe.Offsetof(qa.qpAccessFlags),
		"ibv_qp_attr.cap": unsafe.Offsetof(qa.cap), "ibv_qp_attr.ah_attr": unsafe.Offsetof(qa.ahAttr),
		"ibv_qp_attr.alt_ah_attr": unsafe.Offsetof(qa.altAHAttr), "ibv_qp_attr.pkey_index": unsafe.Offsetof(qa.pkeyIndex),
		"ibv_qp_attr.alt_pkey_index": unsafe.Offsetof(qa.altPkeyIndex), "ibv_qp_attr.en_sqd_async_notify": unsafe.Offsetof(qa.enSQDAsyncNotify),
		"ibv_qp_attr.sq_draining": unsafe.Offsetof(qa.sqDraining), "ibv_qp_attr.max_rd_atomic": unsafe.Offsetof(qa.maxRdAtomic),
		"ibv_qp_attr.max_dest_rd_atomic": unsafe.Offsetof(qa.maxDestRdAtomic), "ibv_qp_attr.min_rnr_timer": unsafe.Offsetof(qa.minRNRTimer),
		"ibv_qp_attr.port_num": unsafe.Offsetof(qa.portNum), "ibv_qp_attr.timeout": unsafe.Offsetof(qa.timeout),
		"ibv_qp_attr.retry_cnt": unsafe.Offsetof(qa.retryCnt), "ibv_qp_attr.rnr_retry": unsafe.Offsetof(qa.rnrRetry),
		"ibv_qp_attr.alt_port_num": unsafe.Offsetof(qa.altPortNum), "ibv_qp_attr.alt_timeout": unsafe.Offsetof(qa.altTimeout),
		"ibv_qp_attr.rate_limit": unsafe.Offsetof(qa.rateLimit),

		"sizeof ibv_srq_attr": unsafe.Sizeof(sa), "ibv_srq_attr.max_wr": unsafe.Offsetof(sa.maxWR),
		"ibv_srq_attr.max_sge": unsafe.Offsetof(sa.maxSGE), "ibv_srq_attr.srq_limit": unsafe.Offsetof(sa.srqLimit),
		"sizeof ibv_srq_init_attr": unsafe.Sizeof(sia), "ibv_srq_init_attr.srq_context": unsafe.Offsetof(sia.srqContext),
		"ibv_srq_init_attr.attr": unsafe.Offsetof(sia.attr),

		"sizeof ibv_async_event": unsafe.Sizeof(ae), "ibv_async_event.element": unsafe.Offsetof(ae.element),
		"ibv_async_event.event_type": unsafe.Offsetof(ae.eventType),

		"sizeof ibv_device_attr": unsafe.Sizeof(da), "ibv_device_attr.fw_ver": unsafe.Offsetof(da.fwVer),
		"ibv_device_attr.node_guid": unsafe.Offsetof(da.nodeGUID), "ibv_device_attr.sys_image_guid": unsafe.Offsetof(da.sysImageGUID),
		"ibv_device_attr.max_mr_size": unsafe.Offsetof(da.maxMRSize), "ibv_device_attr.page_size_cap": unsafe.Offsetof(da.pageSizeCap),
		"ibv_device_attr.vendor_id": unsafe.Offsetof(da.vendorID), "ibv_device_attr.vendor_part_id": unsafe.Offsetof(da.vendorPartID),
		"ibv_device_attr.hw_ver": unsafe.Offsetof(da.hwVer), "ibv_device_attr.max_qp": unsafe.Offsetof(da.maxQP),
		"ibv_device_attr.max_qp_wr": unsafe.Offsetof(da.maxQPWR), "ibv_device_attr.device_cap_flags": unsafe.Offsetof(da.deviceCapFlags),
		"ibv_device_attr.max_sge": unsafe.Offsetof(da.maxSGE), "ibv_device_attr.max_sge_rd": unsafe.Offsetof(da.maxSGERd),
		"ibv_device_attr.max_cq": unsafe.Offsetof(da.maxCQ), "ibv_device_attr.max_cqe": unsafe.Offsetof(da.maxCQE),
		"ibv_device_attr.max_mr": unsafe.Offsetof(da.maxMR), "ibv_device_attr.max_pd": unsafe.Offsetof(da.maxPD),
		"ibv_device_attr.max_qp_rd_atom": unsafe.Offsetof(da.maxQPRdAtom), "ibv_device_attr.max_ee_rd_atom": unsafe.Offsetof(da.maxEERdAtom),
		"ibv_device_attr.max_res_rd_atom": unsafe.Offsetof(da.maxResRdAtom), "ibv_device_attr.max_qp_init_rd_atom": unsafe.Offsetof(da.maxQPInitRdAtom),
		"ibv_device_attr.max_ee_init_rd_atom": unsafe.Offsetof(da.maxEEInitRdAtom), "ibv_device_attr.atomic_cap": unsafe.Offsetof(da.atomicCap),
		"ibv_device_attr.max_ee": unsafe.Offsetof(da.maxEE), "ibv_device_attr.max_rdd": unsafe.Offsetof(da.maxRDD),
		"ibv_device_attr.max_mw": unsafe.Offsetof(da.maxMW), "ibv_device_attr.max_raw_ipv6_qp": unsafe.Offsetof(da.maxRawIPv6QP),
		"ibv_device_attr.max_raw_ethy_qp": unsafe.Offsetof(da.maxRawEthyQP), "ibv_device_attr.max_mcast_grp": unsafe.Offsetof(da.maxMcastGrp),
		"ibv_device_attr.max_mcast_qp_attach": unsafe.Offsetof(da.maxMcastQPAttach), "ibv_device_attr.max_total_mcast_qp_attach": unsafe.Offsetof(da.maxTotalMcastQPAttach),
		"ibv_device_attr.max_ah": unsafe.Offsetof(da.maxAH), "ibv_device_attr.max_fmr": unsafe.Offsetof(da.maxFMR),
		"ibv_device_attr.max_map_per_fmr": unsafe.Offsetof(da.maxMapPerFMR), "ibv_device_attr.max_srq": unsafe.Offsetof(da.maxSRQ),
		"ibv_device_attr.max_srq_wr": unsafe.Offsetof(da.maxSRQWR), "ibv_device_attr.max_srq_sge": unsafe.Offsetof(da.maxSRQSGE),
		"ibv_device_attr.max_pkeys": unsafe.Offsetof(da.maxPkeys), "ibv_device_attr.local_ca_ack_delay": unsafe.Offsetof(da.localCAAckDelay),
		"ibv_device_attr.phys_port_cnt": unsafe.Offsetof(da.physPortCnt),

		"sizeof ibv_port_attr": unsafe.Sizeof(pa), "ibv_port_attr.state": unsafe.Offsetof(pa.state),
		"ibv_port_attr.max_mtu": unsafe.Offsetof(pa.maxMTU), "ibv_port_attr.active_mtu": unsafe.Offsetof(pa.activeMTU),
		"ibv_port_attr.gid_tbl_len": unsafe.Offsetof(pa.gidTblLen), "ibv_port_attr.port_cap_flags": unsafe.Offsetof(pa.portCapFlags),
		"ibv_port_attr.max_msg_sz": unsafe.Offsetof(pa.maxMsgSz), "ibv_port_attr.bad_pkey_cntr": unsafe.Offsetof(pa.badPkeyCntr),
		"ibv_port_attr.qkey_viol_cntr": unsafe.Offsetof(pa.qkeyViolCntr), "ibv_port_attr.pkey_tbl_len": unsafe.Offsetof(pa.pkeyTblLen),
		"ibv_port_attr.lid": unsafe.Offsetof(pa.lid), "ibv_port_attr.sm_lid": unsafe.Offsetof(pa.smLID),
		"ibv_port_attr.lmc": unsafe.Offsetof(pa.lmc), "ibv_port_attr.max_vl_num": unsafe.Offsetof(pa.maxVLNum),
		"ibv_port_attr.sm_sl": unsafe.Offsetof(pa.smSL), "ibv_port_attr.subnet_timeout": unsafe.Offsetof(pa.subnetTimeout),
		"ibv_port_attr.init_type_reply": unsafe.Offsetof(pa.initTypeReply), "ibv_port_attr.active_width": unsafe.Offsetof(pa.activeWidth),
		"ibv_port_attr.active_speed": unsafe.Offsetof(pa.activeSpeed), "ibv_port_attr.phys_state": unsafe.Offsetof(pa.physState),
		"ibv_port_attr.link_layer": unsafe.Offsetof(pa.linkLayer), "ibv_port_attr.flags": unsafe.Offsetof(pa.flags),
		"ibv_port_attr.port_cap_flags2": unsafe.Offsetof(pa.portCapFlags2),

		"sizeof rdma_conn_param": unsafe.Sizeof(cp), "rdma_conn_param.private_data": unsafe.Offsetof(cp.privateData),
		"rdma_conn_param.private_data_len": unsafe.Offsetof(cp.privateDataLen), "rdma_conn_param.responder_resources": unsafe.Offsetof(cp.responderResources),
		"rdma_conn_param.initiator_depth": unsafe.Offsetof(cp.initiatorDepth), "rdma_conn_param.flow_control": unsafe.Offsetof(cp.flowControl),
		"rdma_conn_param.retry_count": unsafe.Offsetof(cp.retryCount), "rdma_conn_param.rnr_retry_count": unsafe.Offsetof(cp.rnrRetryCount),
		"rdma_conn_param.srq": unsafe.Offsetof(cp.srq), "rdma_conn_param.qp_num": unsafe.Offsetof(cp.qpNum),

		"ibv_device.node_type": offDeviceNodeType, "ibv_device.transport_type": offDeviceTransportType,
		"ibv_context.device": offContextDevice, "ibv_context.ops.poll_cq": offContextPollCQ,
		"ibv_context.ops.req_notify_cq": offContextReqNotifyCQ, "ibv_context.ops.post_srq_recv": offContextPostSRQRecv,
		"ibv_context.ops.post_send": offContextPostSend, "ibv_context.ops.post_recv": offContextPostRecv,
		"ibv_context.async_fd": offContextAsyncFD, "ibv_comp_channel.fd": offCompChannelFD,
		"ibv_cq.cqe": offCQCqe, "ibv_qp.qp_num": offQPNum, "ibv_mr.lkey": offMRLKey, "ibv_mr.rkey": offMRRKey,
		"rdma_event_channel.fd": offEventChannelFD, "rdma_cm_id.verbs": offCMIDVerbs,
		"rdma_cm_event.id": offCMEventID, "rdma_cm_event.listen_id": offCMEventListenID,
		"rdma_cm_event.event": offCMEventEvent, "rdma_cm_event.status": offCMEventStatus,
		"rdma_cm_event.param.conn": offCMEventConn,

		"IBV_TRANSPORT_IB": ibvTransportIB, "IBV_TRANSPORT_IWARP": ibvTransportIWARP,
		"IBV_LINK_LAYER_ETHERNET": ibvLinkLayerEthernet, "IBV_QPT_RC": ibvQPTypeRC,
		"IBV_QP_STATE": ibvQPState, "IBV_QP_CUR_STATE": ibvQPCurState, "IBV_QP_ACCESS_FLAGS": ibvQPAccessFlags,
		"IBV_QP_PKEY_INDEX": ibvQPPkeyIndex, "IBV_QP_PORT": ibvQPPort, "IBV_QP_AV": ibvQPAV,
		"IBV_QP_PATH_MTU": ibvQPPathMTU, "IBV_QP_TIMEOUT": ibvQPTimeout, "IBV_QP_RETRY_CNT": ibvQPRetryCnt,
		"IBV_QP_RNR_RETRY": ibvQPRNRRetry, "IBV_QP_RQ_PSN": ibvQPRQPSN, "IBV_QP_MAX_QP_RD_ATOMIC": ibvQPMaxQPRdAtomic,
		"IBV_QP_MIN_RNR_TIMER": ibvQPMinRNRTimer, "IBV_QP_SQ_PSN": ibvQPSQPSN, "IBV_QP_MAX_DEST_RD_ATOMIC": ibvQPMaxDestRdAtomic,
		"IBV_QP_CAP": ibvQPCap_, "IBV_QP_DEST_QPN": ibvQPDestQPN,
		"IBV_WC_WITH_IMM": ibvWCWithImm, "IBV_WC_WITH_INV": ibvWCWithInv,
		"IBV_SRQ_MAX_WR": ibvSRQMaxWR, "IBV_SRQ_LIMIT": ibvSRQLimit, "RDMA_PS_TCP": rdmaPSTCP,
		"RDMA_CM_EVENT_ADDR_RESOLVED": rdmaCMEventAddrResolved, "RDMA_CM_EVENT_ADDR_ERROR": rdmaCMEventAddrError,
		"RDMA_CM_EVENT_ROUTE_RESOLVED": rdmaCMEventRouteResolved, "RDMA_CM_EVENT_ROUTE_ERROR": rdmaCMEventRouteError,
		"RDMA_CM_EVENT_CONNECT_REQUEST": rdmaCMEventConnectRequest, "RDMA_CM_EVENT_CONNECT_RESPONSE": rdmaCMEventConnectResponse,
		"RDMA_CM_EVENT_CONNECT_ERROR": rdmaCMEventConnectError, "RDMA_CM_EVENT_UNREACHABLE": rdmaCMEventUnreachable,
		"RDMA_CM_EVENT_REJECTED": rdmaCMEventRejected, "RDMA_CM_EVENT_ESTABLISHED": rdmaCMEventEstablished,
		"RDMA_CM_EVENT_DISCONNECTED": rdmaCMEventDisconnected, "RDMA_CM_EVENT_DEVICE_REMOVAL": rdmaCMEventDeviceRemoval,
		"RDMA_CM_EVENT_TIMEWAIT_EXIT": rdmaCMEventTimewaitExit,
	}
	addMWLayouts(want)
	if !cheader.HeadersInstalled() {
		t.Skip("the rdma-core headers are not installed: apt-get install libibverbs-dev librdmacm-dev (.ci/run does)")
	}
	got := cheader.Layouts()
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("%s: not measured by package cheader", name)
			continue
		}
		if g != w {
			t.Errorf("%s: C says %d, the Go declaration %d", name, g, w)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: measured in C but not checked against Go", name)
		}
	}
	// PostSend hands the caller's SGE lists to the device as they are.
	if unsafe.Sizeof(dsge) != got["sizeof ibv_sge"] || unsafe.Offsetof(dsge.Addr) != got["ibv_sge.addr"] ||
		unsafe.Offsetof(dsge.Length) != got["ibv_sge.length"] || unsafe.Offsetof(dsge.LKey) != got["ibv_sge.lkey"] {
		t.Errorf("driver.SGE does not have struct ibv_sge's layout")
	}
}
