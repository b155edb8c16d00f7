package wire

import "fmt"

// Opcode is an RDMAP opcode (RFC 5040, section 4.3; RFC 7306, section 5).
type Opcode uint8

// RDMAP opcodes.
const (
	OpWrite        Opcode = 0x0
	OpReadRequest  Opcode = 0x1
	OpReadResponse Opcode = 0x2
	OpSend         Opcode = 0x3
	OpSendInv      Opcode = 0x4
	OpSendSE       Opcode = 0x5
	OpSendSEInv    Opcode = 0x6
	OpTerminate    Opcode = 0x7
	// RFC 7306 opcodes, used only on connections that negotiated them.
	OpImmData        Opcode = 0x8
	OpImmDataSE      Opcode = 0x9
	OpAtomicRequest  Opcode = 0xa
	OpAtomicResponse Opcode = 0xb
)

// Kind is what a message is to the side that receives it, and so which
// part of a receiver handles it: a request goes to its responder, a
// response or a Terminate to its completer (the side that sent the
// request).
type Kind uint8

// Message kinds.
const (
	KindRequest   Kind = iota + 1 // the peer asks: Write, Read Request, Send, Immediate Data, Atomic Request
	KindResponse                  // the peer answers a request: Read Response, Atomic Response
	KindTerminate                 // the peer ends the stream
)

// Message is the RDMAP message an opcode carries, its variants (solicited
// event, invalidation) folded together: a receiver dispatches by it.
type Message uint8

// RDMAP messages.
const (
	MsgWrite Message = iota + 1
	MsgReadRequest
	MsgReadResponse
	MsgSend
	MsgTerminate
	MsgImmData
	MsgAtomicRequest
	MsgAtomicResponse
	// NumMessages bounds the messages, for tables indexed by them.
	NumMessages
)

// OpInfo is what the wire says of an RDMAP opcode: the one table the
// names, header lengths, buffer models, queues and dispatch of the
// opcodes come from (as rxe's rxe_opcode table and siw's iwarp_pktinfo).
type OpInfo struct {
	// Name is the opcode's name as RFC 5040 and RFC 7306 give it.
	Name string
	// HeaderLen is the length of an FPDU's headers, counted from the
	// length field; 0 for an opcode RDMAP does not define.
	HeaderLen int
	// Tagged: the tagged buffer model; otherwise untagged, on queue QN.
	Tagged bool
	// QN is the DDP queue of an untagged opcode.
	QN uint32
	// Kind says whether it is a request, a response or a Terminate.
	Kind Kind
	// Msg is the message it carries.
	Msg Message
	// Solicited: the message asks for a solicited event.
	Solicited bool
	// Invalidate: the message invalidates the STag its header names.
	Invalidate bool
	// Extension: an RFC 7306 opcode, valid only when negotiated.
	Extension bool
	// Bare: the message is its headers alone, one DDP segment with no
	// payload.
	Bare bool
}

// ops is the opcode table, indexed by opcode.
var ops = [rdmapOpcode + 1]OpInfo{
	OpWrite:          {Name: "Write", HeaderLen: TaggedLen, Tagged: true, Kind: KindRequest, Msg: MsgWrite},
	OpReadRequest:    {Name: "ReadRequest", HeaderLen: ReadRequestLen, QN: QNRead, Kind: KindRequest, Msg: MsgReadRequest, Bare: true},
	OpReadResponse:   {Name: "ReadResponse", HeaderLen: TaggedLen, Tagged: true, Kind: KindResponse, Msg: MsgReadResponse},
	OpSend:           {Name: "Send", HeaderLen: UntaggedLen, QN: QNSend, Kind: KindRequest, Msg: MsgSend},
	OpSendInv:        {Name: "SendInv", HeaderLen: UntaggedLen, QN: QNSend, Kind: KindRequest, Msg: MsgSend, Invalidate: true},
	OpSendSE:         {Name: "SendSE", HeaderLen: UntaggedLen, QN: QNSend, Kind: KindRequest, Msg: MsgSend, Solicited: true},
	OpSendSEInv:      {Name: "SendSEInv", HeaderLen: UntaggedLen, QN: QNSend, Kind: KindRequest, Msg: MsgSend, Solicited: true, Invalidate: true},
	OpTerminate:      {Name: "Terminate", HeaderLen: TerminateLen, QN: QNTerminate, Kind: KindTerminate, Msg: MsgTerminate},
	OpImmData:        {Name: "ImmData", HeaderLen: ImmDataLen, QN: QNSend, Kind: KindRequest, Msg: MsgImmData, Extension: true, Bare: true},
	OpImmDataSE:      {Name: "ImmDataSE", HeaderLen: ImmDataLen, QN: QNSend, Kind: KindRequest, Msg: MsgImmData, Solicited: true, Extension: true, Bare: true},
	OpAtomicRequest:  {Name: "AtomicRequest", HeaderLen: AtomicReqLen, QN: QNAtomic, Kind: KindRequest, Msg: MsgAtomicRequest, Extension: true, Bare: true},
	OpAtomicResponse: {Name: "AtomicResponse", HeaderLen: AtomicRespLen, QN: QNAtomic, Kind: KindResponse, Msg: MsgAtomicResponse, Extension: true, Bare: true},
}

// undefined is the table entry of an opcode RDMAP does not define.
var undefined OpInfo

// info is o's table entry.
func (o Opcode) info() *OpInfo {
	if int(o) < len(ops) {
		return &ops[o]
	}
	return &undefined
}

// Info returns what the opcode table says of o; an opcode RDMAP does not
// define has a HeaderLen of 0.
func (o Opcode) Info() OpInfo { return *o.info() }

// String names the opcode as RFC 5040 and RFC 7306 do.
func (o Opcode) String() string {
	if n := o.info().Name; n != "" {
		return n
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// Defined reports whether RDMAP defines o.
func (o Opcode) Defined() bool { return o.info().HeaderLen != 0 }

// Tagged reports whether messages of opcode o use the tagged buffer model.
func (o Opcode) Tagged() bool { return o.info().Tagged }

// QN is the DDP queue of an untagged opcode.
func (o Opcode) QN() uint32 { return o.info().QN }

// Kind says whether o is a request, a response or a Terminate.
func (o Opcode) Kind() Kind { return o.info().Kind }

// Msg is the message o carries.
func (o Opcode) Msg() Message { return o.info().Msg }

// Solicited reports whether o asks for a solicited event.
func (o Opcode) Solicited() bool { return o.info().Solicited }

// Invalidates reports whether o invalidates the STag its header names.
func (o Opcode) Invalidates() bool { return o.info().Invalidate }

// Extension reports whether o is an RFC 7306 opcode.
func (o Opcode) Extension() bool { return o.info().Extension }

// Bare reports whether a message of o is its headers alone.
func (o Opcode) Bare() bool { return o.info().Bare }

// IsSend reports whether o is one of the four Send opcodes.
func (o Opcode) IsSend() bool { return o.info().Msg == MsgSend }

// HeaderLen returns the length of the headers of an FPDU of opcode op,
// counted from the length field; 0 for an opcode RDMAP does not define.
func HeaderLen(op Opcode) int { return op.info().HeaderLen }
