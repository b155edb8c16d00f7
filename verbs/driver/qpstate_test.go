package driver

import (
	"errors"
	"strings"
	"testing"
)

// TestModifyErrorsNameAttributes: a refused Modify names the attributes
// a transition lacks or does not take by their constants' names, never
// as a bare hex mask.
func TestModifyErrorsNameAttributes(t *testing.T) {
	for _, tc := range []struct {
		what      string
		cur       QPState
		attr      QPAttr
		mask      QPAttrMask
		want      []string
		wantError error
	}{
		{"Reset to Init with the state alone", QPSReset, QPAttr{State: QPSInit}, QPAttrState,
			[]string{"RESET to INIT", "lacks QPAttrAccessFlags|QPAttrPort"}, ErrInvalidArg},
		{"Reset to Init without Port", QPSReset, QPAttr{State: QPSInit, AccessFlags: AccessLocalWrite}, QPAttrState | QPAttrAccessFlags,
			[]string{"lacks QPAttrPort"}, ErrInvalidArg},
		{"Init to RTR without DestQPN", QPSInit, QPAttr{State: QPSRTR, PathMTU: MTU1024},
			QPAttrState | QPAttrPathMTU | QPAttrRQPSN | QPAttrMaxDestRdAtomic | QPAttrMinRNRTimer,
			[]string{"INIT to RTR", "lacks QPAttrDestQPN"}, ErrInvalidArg},
		{"Reset to Init with PathMTU", QPSReset, QPAttr{State: QPSInit, Port: 1, PathMTU: MTU1024},
			QPAttrState | QPAttrPort | QPAttrAccessFlags | QPAttrPathMTU,
			[]string{"does not take the attributes QPAttrPathMTU"}, ErrInvalidArg},
		{"to Err with Port", QPSRTS, QPAttr{State: QPSErr, Port: 1}, QPAttrState | QPAttrPort,
			[]string{"besides QPAttrState", "QPAttrPort"}, ErrInvalidArg},
	} {
		_, err := CheckModify(tc.cur, &tc.attr, tc.mask)
		if !errors.Is(err, tc.wantError) {
			t.Errorf("%s: %v, want an error wrapping %v", tc.what, err, tc.wantError)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.what, err, w)
			}
		}
		if strings.Contains(err.Error(), "0x") {
			t.Errorf("%s: %q shows a hex mask", tc.what, err)
		}
	}
}

// TestQPAttrMaskString names each bit as its constant, and unknown bits
// in hex.
func TestQPAttrMaskString(t *testing.T) {
	for m, want := range map[QPAttrMask]string{
		0:                                 "0",
		QPAttrState:                       "QPAttrState",
		QPAttrPort | QPAttrAccessFlags:    "QPAttrAccessFlags|QPAttrPort",
		QPAttrCap:                         "QPAttrCap",
		QPAttrRNRRetry | 1<<20:            "QPAttrRNRRetry|0x100000",
		QPAttrDestQPN | QPAttrMinRNRTimer: "QPAttrDestQPN|QPAttrMinRNRTimer",
	} {
		if got := m.String(); got != want {
			t.Errorf("QPAttrMask(%#x).String() = %q, want %q", uint32(m), got, want)
		}
	}
}
