//go:build cgo

package cheader

/*
#include <stddef.h>

struct layout { const char *name; size_t value; };

#if __has_include(<infiniband/verbs.h>) && __has_include(<rdma/rdma_cma.h>)
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define HAVE_HEADERS 1
#define L(name, expr) { name, expr },
// S: the size of struct s; F: the offset of its field f; K: a constant.
#define S(s) L("sizeof " #s, sizeof(struct s))
#define F(s, f) L(#s "." #f, offsetof(struct s, f))
#define K(c) L(#c, c)
static const struct layout layouts[] = {
	S(ibv_sge)
	F(ibv_sge, addr)
	F(ibv_sge, length)
	F(ibv_sge, lkey)

	S(ibv_send_wr)
	F(ibv_send_wr, wr_id)
	F(ibv_send_wr, next)
	F(ibv_send_wr, sg_list)
	F(ibv_send_wr, num_sge)
	F(ibv_send_wr, opcode)
	F(ibv_send_wr, send_flags)
	F(ibv_send_wr, imm_data)
	F(ibv_send_wr, invalidate_rkey)
	F(ibv_send_wr, wr.rdma.remote_addr)
	F(ibv_send_wr, wr.rdma.rkey)
	F(ibv_send_wr, wr.atomic.remote_addr)
	F(ibv_send_wr, wr.atomic.compare_add)
	F(ibv_send_wr, wr.atomic.swap)
	F(ibv_send_wr, wr.atomic.rkey)
	F(ibv_send_wr, qp_type)
	F(ibv_send_wr, bind_mw)
	F(ibv_send_wr, bind_mw.mw)
	F(ibv_send_wr, bind_mw.rkey)
	F(ibv_send_wr, bind_mw.bind_info)
	S(ibv_mw_bind_info)
	F(ibv_mw_bind_info, mr)
	F(ibv_mw_bind_info, addr)
	F(ibv_mw_bind_info, length)
	F(ibv_mw_bind_info, mw_access_flags)
	S(ibv_mw_bind)
	F(ibv_mw_bind, wr_id)
	F(ibv_mw_bind, send_flags)
	F(ibv_mw_bind, bind_info)
	F(ibv_mw, rkey)
	F(ibv_context, ops.alloc_mw)
	F(ibv_context, ops.bind_mw)
	F(ibv_context, ops.dealloc_mw)
	K(IBV_DEVICE_MEM_WINDOW)
	L("IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B", IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)
	K(IBV_MW_TYPE_1)
	K(IBV_MW_TYPE_2)
	K(IBV_WR_LOCAL_INV)
	K(IBV_WR_BIND_MW)
	K(IBV_WR_SEND_WITH_INV)
	K(IBV_WC_BIND_MW)
	K(IBV_WC_LOCAL_INV)
	K(IBV_ACCESS_MW_BIND)

	S(ibv_recv_wr)
	F(ibv_recv_wr, wr_id)
	F(ibv_recv_wr, next)
	F(ibv_recv_wr, sg_list)
	F(ibv_recv_wr, num_sge)

	S(ibv_wc)
	F(ibv_wc, wr_id)
	F(ibv_wc, status)
	F(ibv_wc, opcode)
	F(ibv_wc, vendor_err)
	F(ibv_wc, byte_len)
	F(ibv_wc, imm_data)
	F(ibv_wc, qp_num)
	F(ibv_wc, src_qp)
	F(ibv_wc, wc_flags)
	F(ibv_wc, pkey_index)
	F(ibv_wc, slid)
	F(ibv_wc, sl)
	F(ibv_wc, dlid_path_bits)

	S(ibv_qp_cap)
	F(ibv_qp_cap, max_send_wr)
	F(ibv_qp_cap, max_recv_wr)
	F(ibv_qp_cap, max_send_sge)
	F(ibv_qp_cap, max_recv_sge)
	F(ibv_qp_cap, max_inline_data)

	S(ibv_qp_init_attr)
	F(ibv_qp_init_attr, qp_context)
	F(ibv_qp_init_attr, send_cq)
	F(ibv_qp_init_attr, recv_cq)
	F(ibv_qp_init_attr, srq)
	F(ibv_qp_init_attr, cap)
	F(ibv_qp_init_attr, qp_type)
	F(ibv_qp_init_attr, sq_sig_all)

	S(ibv_global_route)
	F(ibv_global_route, dgid)
	F(ibv_global_route, flow_label)
	F(ibv_global_route, sgid_index)
	F(ibv_global_route, hop_limit)
	F(ibv_global_route, traffic_class)

	S(ibv_ah_attr)
	F(ibv_ah_attr, grh)
	F(ibv_ah_attr, dlid)
	F(ibv_ah_attr, sl)
	F(ibv_ah_attr, src_path_bits)
	F(ibv_ah_attr, static_rate)
	F(ibv_ah_attr, is_global)
	F(ibv_ah_attr, port_num)

	S(ibv_qp_attr)
	F(ibv_qp_attr, qp_state)
	F(ibv_qp_attr, cur_qp_state)
	F(ibv_qp_attr, path_mtu)
	F(ibv_qp_attr, path_mig_state)
	F(ibv_qp_attr, qkey)
	F(ibv_qp_attr, rq_psn)
	F(ibv_qp_attr, sq_psn)
	F(ibv_qp_attr, dest_qp_num)
	F(ibv_qp_attr, qp_access_flags)
	F(ibv_qp_attr, cap)
	F(ibv_qp_attr, ah_attr)
	F(ibv_qp_attr, alt_ah_attr)
	F(ibv_qp_attr, pkey_index)
	F(ibv_qp_attr, alt_pkey_index)
	F(ibv_qp_attr, en_sqd_async_notify)
	F(ibv_qp_attr, sq_draining)
	F(ibv_qp_attr, max_rd_atomic)
	F(ibv_qp_attr, max_dest_rd_atomic)
	F(ibv_qp_attr, min_rnr_timer)
	F(ibv_qp_attr, port_num)
	F(ibv_qp_attr, timeout)
	F(ibv_qp_attr, retry_cnt)
	F(ibv_qp_attr, rnr_retry)
	F(ibv_qp_attr, alt_port_num)
	F(ibv_qp_attr, alt_timeout)
	F(ibv_qp_attr, rate_limit)

	S(ibv_srq_attr)
	F(ibv_srq_attr, max_wr)
	F(ibv_srq_attr, max_sge)
	F(ibv_srq_attr, srq_limit)
	S(ibv_srq_init_attr)
	F(ibv_srq_init_attr, srq_context)
	F(ibv_srq_init_attr, attr)

	S(ibv_async_event)
	F(ibv_async_event, element)
	F(ibv_async_event, event_type)

	S(ibv_device_attr)
	F(ibv_device_attr, fw_ver)
	F(ibv_device_attr, node_guid)
	F(ibv_device_attr, sys_image_guid)
	F(ibv_device_attr, max_mr_size)
	F(ibv_device_attr, page_size_cap)
	F(ibv_device_attr, vendor_id)
	F(ibv_device_attr, vendor_part_id)
	F(ibv_device_attr, hw_ver)
	F(ibv_device_attr, max_qp)
	F(ibv_device_attr, max_qp_wr)
	F(ibv_device_attr, device_cap_flags)
	F(ibv_device_attr, max_sge)
	F(ibv_device_attr, max_sge_rd)
	F(ibv_device_attr, max_cq)
	F(ibv_device_attr, max_cqe)
	F(ibv_device_attr, max_mr)
	F(ibv_device_attr, max_pd)
	F(ibv_device_attr, max_qp_rd_atom)
	F(ibv_device_attr, max_ee_rd_atom)
	F(ibv_device_attr, max_res_rd_atom)
	F(ibv_device_attr, max_qp_init_rd_atom)
	F(ibv_device_attr, max_ee_init_rd_atom)
	F(ibv_device_attr, atomic_cap)
	F(ibv_device_attr, max_ee)
	F(ibv_device_attr, max_rdd)
	F(ibv_device_attr, max_mw)
	F(ibv_device_attr, max_raw_ipv6_qp)
	F(ibv_device_attr, max_raw_ethy_qp)
	F(ibv_device_attr, max_mcast_grp)
	F(ibv_device_attr, max_mcast_qp_attach)
	F(ibv_device_attr, max_total_mcast_qp_attach)
	F(ibv_device_attr, max_ah)
	F(ibv_device_attr, max_fmr)
	F(ibv_device_attr, max_map_per_fmr)
	F(ibv_device_attr, max_srq)
	F(ibv_device_attr, max_srq_wr)
	F(ibv_device_attr, max_srq_sge)
	F(ibv_device_attr, max_pkeys)
	F(ibv_device_attr, local_ca_ack_delay)
	F(ibv_device_attr, phys_port_cnt)

	S(ibv_port_attr)
	F(ibv_port_attr, state)
	F(ibv_port_attr, max_mtu)
	F(ibv_port_attr, active_mtu)
	F(ibv_port_attr, gid_tbl_len)
	F(ibv_port_attr, port_cap_flags)
	F(ibv_port_attr, max_msg_sz)
	F(ibv_port_attr, bad_pkey_cntr)
	F(ibv_port_attr, qkey_viol_cntr)
	F(ibv_port_attr, pkey_tbl_len)
	F(ibv_port_attr, lid)
	F(ibv_port_attr, sm_lid)
	F(ibv_port_attr, lmc)
	F(ibv_port_attr, max_vl_num)
	F(ibv_port_attr, sm_sl)
	F(ibv_port_attr, subnet_timeout)
	F(ibv_port_attr, init_type_reply)
	F(ibv_port_attr, active_width)
	F(ibv_port_attr, active_speed)
	F(ibv_port_attr, phys_state)
	F(ibv_port_attr, link_layer)
	F(ibv_port_attr, flags)
	F(ibv_port_attr, port_cap_flags2)

	S(rdma_conn_param)
	F(rdma_conn_param, private_data)
	F(rdma_conn_param, private_data_len)
	F(rdma_conn_param, responder_resources)
	F(rdma_conn_param, initiator_depth)
	F(rdma_conn_param, flow_control)
	F(rdma_conn_param, retry_count)
	F(rdma_conn_param, rnr_retry_count)
	F(rdma_conn_param, srq)
	F(rdma_conn_param, qp_num)

	F(ibv_device, node_type)
	F(ibv_device, transport_type)
	F(ibv_context, device)
	F(ibv_context, ops.poll_cq)
	F(ibv_context, ops.req_notify_cq)
	F(ibv_context, ops.post_srq_recv)
	F(ibv_context, ops.post_send)
	F(ibv_context, ops.post_recv)
	F(ibv_context, async_fd)
	F(ibv_comp_channel, fd)
	F(ibv_cq, cqe)
	F(ibv_qp, qp_num)
	F(ibv_mr, lkey)
	F(ibv_mr, rkey)
	F(rdma_event_channel, fd)
	F(rdma_cm_id, verbs)
	F(rdma_cm_event, id)
	F(rdma_cm_event, listen_id)
	F(rdma_cm_event, event)
	F(rdma_cm_event, status)
	F(rdma_cm_event, param.conn)

	K(IBV_TRANSPORT_IB)
	K(IBV_TRANSPORT_IWARP)
	K(IBV_LINK_LAYER_ETHERNET)
	K(IBV_QPT_RC)
	K(IBV_QP_STATE)
	K(IBV_QP_CUR_STATE)
	K(IBV_QP_ACCESS_FLAGS)
	K(IBV_QP_PKEY_INDEX)
	K(IBV_QP_PORT)
	K(IBV_QP_AV)
	K(IBV_QP_PATH_MTU)
	K(IBV_QP_TIMEOUT)
	K(IBV_QP_RETRY_CNT)
	K(IBV_QP_RNR_RETRY)
	K(IBV_QP_RQ_PSN)
	K(IBV_QP_MAX_QP_RD_ATOMIC)
	K(IBV_QP_MIN_RNR_TIMER)
	K(IBV_QP_SQ_PSN)
	K(IBV_QP_MAX_DEST_RD_ATOMIC)
	K(IBV_QP_CAP)
	K(IBV_QP_DEST_QPN)
	K(IBV_WC_WITH_IMM)
	K(IBV_WC_WITH_INV)
	K(IBV_SRQ_MAX_WR)
	K(IBV_SRQ_LIMIT)
	K(RDMA_PS_TCP)
	K(RDMA_CM_EVENT_ADDR_RESOLVED)
	K(RDMA_CM_EVENT_ADDR_ERROR)
	K(RDMA_CM_EVENT_ROUTE_RESOLVED)
	K(RDMA_CM_EVENT_ROUTE_ERROR)
	K(RDMA_CM_EVENT_CONNECT_REQUEST)
	K(RDMA_CM_EVENT_CONNECT_RESPONSE)
	K(RDMA_CM_EVENT_CONNECT_ERROR)
	K(RDMA_CM_EVENT_UNREACHABLE)
	K(RDMA_CM_EVENT_REJECTED)
	K(RDMA_CM_EVENT_ESTABLISHED)
	K(RDMA_CM_EVENT_DISCONNECTED)
	K(RDMA_CM_EVENT_DEVICE_REMOVAL)
	K(RDMA_CM_EVENT_TIMEWAIT_EXIT)
};
static size_t nlayouts(void) { return sizeof(layouts) / sizeof(layouts[0]); }
#else
#define HAVE_HEADERS 0
static const struct layout layouts[1];
static size_t nlayouts(void) { return 0; }
#endif
static const char *layout_name(size_t i) { return layouts[i].name; }
static size_t layout_value(size_t i) { return layouts[i].value; }
static int identity(int x) { return x; }

#include <alloca.h>
#include <stdint.h>
// use_stack takes n bytes of stack and writes one byte in every stride
// of them, from the lowest address up; it returns the sum of the bytes
// written.
static unsigned long use_stack(unsigned long n, unsigned long stride) {
	volatile unsigned char *p = alloca(n);
	unsigned long sum = 0;
	for (unsigned long i = 0; i < n; i += stride) {
		p[i] = (unsigned char)(i / stride);
		sum += p[i];
	}
	return sum;
}
static uintptr_t use_stack_func(void) { return (uintptr_t)use_stack; }
*/
import "C"

// UseStackFunc is the address of a C function
//
//	unsigned long use_stack(unsigned long n, unsigned long stride)
//
// that takes n bytes of stack and writes one byte in every stride of them,
// from the lowest address up, byte k being k mod 256; it returns the sum of
// the bytes written. Tests call it on the provider's C stacks.
func UseStackFunc() uintptr { return uintptr(C.use_stack_func()) }

// Identity returns x from a C function, called through cgo: what
// BenchmarkCgoCall measures, the cost of a cgo call, to set beside the
// provider's own foreign call (BenchmarkForeignCall).
func Identity(x int) int { return int(C.identity(C.int(x))) }

// HeadersInstalled reports whether the headers were there to compile
// against; without them Layouts is empty.
func HeadersInstalled() bool { return C.HAVE_HEADERS != 0 }

// Layouts returns every size, offset and constant the C compiler reports,
// by name: "sizeof ibv_sge", "ibv_sge.lkey", "IBV_QP_STATE", ...
func Layouts() map[string]uintptr {
	m := map[string]uintptr{}
	for i := C.size_t(0); i < C.nlayouts(); i++ {
		m[C.GoString(C.layout_name(i))] = uintptr(C.layout_value(i))
	}
	return m
}
