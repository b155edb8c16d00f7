//go:build cgo

package ibverbs

import (
	"unsafe"

	"github.com/goverbs/goverbs/verbs/driver"
)

// addMWLayouts adds to want the memory window structures, offsets and
// constants the provider declares, for TestLayoutMatchesHeaders.
func addMWLayouts(want map[string]uintptr) {
	var (
		swr ibvSendWR
		bi  ibvMWBindInfo
		b   ibvMWBind
	)
	for k, v := range map[string]uintptr{
		"ibv_send_wr.bind_mw.mw":        unsafe.Offsetof(swr.bindMW) + unsafe.Offsetof(swr.bindMW.mw),
		"ibv_send_wr.bind_mw.rkey":      unsafe.Offsetof(swr.bindMW) + unsafe.Offsetof(swr.bindMW.rkey),
		"ibv_send_wr.bind_mw.bind_info": unsafe.Offsetof(swr.bindMW) + unsafe.Offsetof(swr.bindMW.info),

		"sizeof ibv_mw_bind_info": unsafe.Sizeof(bi), "ibv_mw_bind_info.mr": unsafe.Offsetof(bi.mr),
		"ibv_mw_bind_info.addr": unsafe.Offsetof(bi.addr), "ibv_mw_bind_info.length": unsafe.Offsetof(bi.length),
		"ibv_mw_bind_info.mw_access_flags": unsafe.Offsetof(bi.access),

		"sizeof ibv_mw_bind": unsafe.Sizeof(b), "ibv_mw_bind.wr_id": unsafe.Offsetof(b.wrID),
		"ibv_mw_bind.send_flags": unsafe.Offsetof(b.sendFlags), "ibv_mw_bind.bind_info": unsafe.Offsetof(b.info),

		"ibv_mw.rkey": offMWRKey, "ibv_context.ops.alloc_mw": offContextAllocMW,
		"ibv_context.ops.bind_mw": offContextBindMW, "ibv_context.ops.dealloc_mw": offContextDeallocMW,

		"IBV_DEVICE_MEM_WINDOW": ibvDeviceMemWindow,
		"IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B": ibvDeviceMemWindowType2,
		// The driver's values are passed to the device as they are.
		"IBV_MW_TYPE_1": uintptr(driver.MWType1), "IBV_MW_TYPE_2": uintptr(driver.MWType2),
		"IBV_WR_LOCAL_INV": uintptr(driver.OpLocalInv), "IBV_WR_BIND_MW": uintptr(driver.OpBindMW),
		"IBV_WR_SEND_WITH_INV": uintptr(driver.OpSendWithInv),
		"IBV_WC_BIND_MW":       uintptr(driver.WCBindMW), "IBV_WC_LOCAL_INV": uintptr(driver.WCLocalInv),
		"IBV_ACCESS_MW_BIND": uintptr(driver.AccessMWBind),
	} {
		want[k] = v
	}
}
