package ibverbs

// The C structures of <infiniband/verbs.h> and <rdma/rdma_cma.h> that the
// provider builds or reads, declared for LP64 Linux (amd64, arm64).
// layout_test.go checks every size and offset here against the headers
// with cgo.

// ibvSGE is struct ibv_sge.
type ibvSGE struct {
	addr   uint64
	length uint32
	lkey   uint32
}

// ibvSendWR is struct ibv_send_wr. The wr union is spelled as its atomic
// member; wr.rdma.rkey shares its first four bytes with compareAdd (read
// the layout test), and wr.rdma.remote_addr is remoteAddr.
type ibvSendWR struct {
	wrID       uint64
	next       uintptr
	sgList     uintptr
	numSGE     int32
	opcode     uint32
	sendFlags  uint32
	immData    uint32 // imm_data (big-endian) or invalidate_rkey
	remoteAddr uint64
	compareAdd uint64 // wr.atomic.compare_add; wr.rdma.rkey in the low half
	swap       uint64
	atomicRKey uint32
	_          uint32
	qpType     uint32
	_          uint32
	bindMW     ibvBindMW
}

// ibvRecvWR is struct ibv_recv_wr.
type ibvRecvWR struct {
	wrID   uint64
	next   uintptr
	sgList uintptr
	numSGE int32
	_      int32
}

// ibvWC is struct ibv_wc.
type ibvWC struct {
	wrID         uint64
	status       uint32
	opcode       uint32
	vendorErr    uint32
	byteLen      uint32
	immData      uint32 // imm_data (big-endian) or invalidated_rkey
	qpNum        uint32
	srcQP        uint32
	wcFlags      uint32
	pkeyIndex    uint16
	slid         uint16
	sl           uint8
	dlidPathBits uint8
	_            [2]byte
}

// ibvQPCap is struct ibv_qp_cap.
type ibvQPCap struct {
	maxSendWR, maxRecvWR, maxSendSGE, maxRecvSGE, maxInlineData uint32
}

// ibvQPInitAttr is struct ibv_qp_init_attr.
type ibvQPInitAttr struct {
	qpContext uintptr
	sendCQ    uintptr
	recvCQ    uintptr
	srq       uintptr
	cap       ibvQPCap
	qpType    uint32
	sqSigAll  int32
	_         uint32
}

// ibvGlobalRoute is struct ibv_global_route.
type ibvGlobalRoute struct {
	dgid         [16]byte
	flowLabel    uint32
	sgidIndex    uint8
	hopLimit     uint8
	trafficClass uint8
	_            uint8
}

// ibvAHAttr is struct ibv_ah_attr.
type ibvAHAttr struct {
	grh         ibvGlobalRoute
	dlid        uint16
	sl          uint8
	srcPathBits uint8
	staticRate  uint8
	isGlobal    uint8
	portNum     uint8
	_           uint8
}

// ibvQPAttr is struct ibv_qp_attr.
type ibvQPAttr struct {
	qpState          uint32
	curQPState       uint32
	pathMTU          uint32
	pathMigState     uint32
	qkey             uint32
	rqPSN            uint32
	sqPSN            uint32
	destQPNum        uint32
	qpAccessFlags    uint32
	cap              ibvQPCap
	ahAttr           ibvAHAttr
	altAHAttr        ibvAHAttr
	pkeyIndex        uint16
	altPkeyIndex     uint16
	enSQDAsyncNotify uint8
	sqDraining       uint8
	maxRdAtomic      uint8
	maxDestRdAtomic  uint8
	minRNRTimer      uint8
	portNum          uint8
	timeout          uint8
	retryCnt         uint8
	rnrRetry         uint8
	altPortNum       uint8
	altTimeout       uint8
	_                uint8
	rateLimit        uint32
	_                uint32 // union ibv_gid makes the C struct 8-byte aligned
}

// ibvSRQAttr is struct ibv_srq_attr.
type ibvSRQAttr struct {
	maxWR, maxSGE, srqLimit uint32
}

// ibvSRQInitAttr is struct ibv_srq_init_attr.
type ibvSRQInitAttr struct {
	srqContext uintptr
	attr       ibvSRQAttr
	_          uint32
}

// ibvAsyncEvent is struct ibv_async_event.
type ibvAsyncEvent struct {
	element   uintptr
	eventType uint32
	_         uint32
}

// ibvDeviceAttr is struct ibv_device_attr.
type ibvDeviceAttr struct {
	fwVer                 [64]byte
	nodeGUID              uint64
	sysImageGUID          uint64
	maxMRSize             uint64
	pageSizeCap           uint64
	vendorID              uint32
	vendorPartID          uint32
	hwVer                 uint32
	maxQP                 int32
	maxQPWR               int32
	deviceCapFlags        uint32
	maxSGE                int32
	maxSGERd              int32
	maxCQ                 int32
	maxCQE                int32
	maxMR                 int32
	maxPD                 int32
	maxQPRdAtom           int32
	maxEERdAtom           int32
	maxResRdAtom          int32
	maxQPInitRdAtom       int32
	maxEEInitRdAtom       int32
	atomicCap             uint32
	maxEE                 int32
	maxRDD                int32
	maxMW                 int32
	maxRawIPv6QP          int32
	maxRawEthyQP          int32
	maxMcastGrp           int32
	maxMcastQPAttach      int32
	maxTotalMcastQPAttach int32
	maxAH                 int32
	maxFMR                int32
	maxMapPerFMR          int32
	maxSRQ                int32
	maxSRQWR              int32
	maxSRQSGE             int32
	maxPkeys              uint16
	localCAAckDelay       uint8
	physPortCnt           uint8
}

// ibvPortAttr is struct ibv_port_attr.
type ibvPortAttr struct {
	state         uint32
	maxMTU        uint32
	activeMTU     uint32
	gidTblLen     int32
	portCapFlags  uint32
	maxMsgSz      uint32
	badPkeyCntr   uint32
	qkeyViolCntr  uint32
	pkeyTblLen    uint16
	lid           uint16
	smLID         uint16
	lmc           uint8
	maxVLNum      uint8
	smSL          uint8
	subnetTimeout uint8
	initTypeReply uint8
	activeWidth   uint8
	activeSpeed   uint8
	physState     uint8
	linkLayer     uint8
	flags         uint8
	portCapFlags2 uint16
	_             uint16
}

// rdmaConnParam is struct rdma_conn_param.
type rdmaConnParam struct {
	privateData        uintptr
	privateDataLen     uint8
	responderResources uint8
	initiatorDepth     uint8
	flowControl        uint8
	retryCount         uint8
	rnrRetryCount      uint8
	srq                uint8
	_                  uint8
	qpNum              uint32
	_                  uint32
}

// Offsets of the fields the provider reads in structures libibverbs and
// librdmacm allocate.
const (
	offDeviceNodeType      = 16  // struct ibv_device.node_type
	offDeviceTransportType = 20  // struct ibv_device.transport_type
	offContextDevice       = 0   // struct ibv_context.device
	offContextPollCQ       = 96  // struct ibv_context.ops.poll_cq
	offContextReqNotifyCQ  = 104 // struct ibv_context.ops.req_notify_cq
	offContextPostSRQRecv  = 168 // struct ibv_context.ops.post_srq_recv
	offContextPostSend     = 208 // struct ibv_context.ops.post_send
	offContextPostRecv     = 216 // struct ibv_context.ops.post_recv
	offContextAsyncFD      = 268 // struct ibv_context.async_fd
	offCompChannelFD       = 8   // struct ibv_comp_channel.fd
	offCQCqe               = 28  // struct ibv_cq.cqe
	offQPNum               = 52  // struct ibv_qp.qp_num
	offMRLKey              = 36  // struct ibv_mr.lkey
	offMRRKey              = 40  // struct ibv_mr.rkey
	offEventChannelFD      = 0   // struct rdma_event_channel.fd
	offCMIDVerbs           = 0   // struct rdma_cm_id.verbs
	offCMEventID           = 0   // struct rdma_cm_event.id
	offCMEventListenID     = 8   // struct rdma_cm_event.listen_id
	offCMEventEvent        = 16  // struct rdma_cm_event.event
	offCMEventStatus       = 20  // struct rdma_cm_event.status
	offCMEventConn         = 24  // struct rdma_cm_event.param.conn
)

// Values of the C enumerations the provider uses.
const (
	ibvTransportIB    = 0 // IBV_TRANSPORT_IB
	ibvTransportIWARP = 1 // IBV_TRANSPORT_IWARP

	ibvLinkLayerEthernet = 2 // IBV_LINK_LAYER_ETHERNET

	ibvQPTypeRC = 2 // IBV_QPT_RC

	// enum ibv_qp_attr_mask
	ibvQPState           = 1 << 0
	ibvQPCurState        = 1 << 1
	ibvQPAccessFlags     = 1 << 3
	ibvQPPkeyIndex       = 1 << 4
	ibvQPPort            = 1 << 5
	ibvQPAV              = 1 << 7
	ibvQPPathMTU         = 1 << 8
	ibvQPTimeout         = 1 << 9
	ibvQPRetryCnt        = 1 << 10
	ibvQPRNRRetry        = 1 << 11
	ibvQPRQPSN           = 1 << 12
	ibvQPMaxQPRdAtomic   = 1 << 13
	ibvQPMinRNRTimer     = 1 << 15
	ibvQPSQPSN           = 1 << 16
	ibvQPMaxDestRdAtomic = 1 << 17
	ibvQPCap_            = 1 << 19
	ibvQPDestQPN         = 1 << 20

	// enum ibv_wc_flags
	ibvWCWithImm = 1 << 1
	ibvWCWithInv = 1 << 3

	// enum ibv_srq_attr_mask
	ibvSRQMaxWR = 1 << 0
	ibvSRQLimit = 1 << 1

	// enum rdma_port_space, enum rdma_cm_event_type
	rdmaPSTCP                  = 0x0106
	rdmaCMEventAddrResolved    = 0
	rdmaCMEventAddrError       = 1
	rdmaCMEventRouteResolved   = 2
	rdmaCMEventRouteError      = 3
	rdmaCMEventConnectRequest  = 4
	rdmaCMEventConnectResponse = 5
	rdmaCMEventConnectError    = 6
	rdmaCMEventUnreachable     = 7
	rdmaCMEventRejected        = 8
	rdmaCMEventEstablished     = 9
	rdmaCMEventDisconnected    = 10
	rdmaCMEventDeviceRemoval   = 11
	rdmaCMEventTimewaitExit    = 15
)
