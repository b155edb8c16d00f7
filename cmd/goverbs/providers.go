package main

// The providers goverbs offers. Every provider registers its devices (and
// its cm address scheme) from its init function; this file is the one
// place that imports them, and a new provider is added here.
import (
	_ "github.com/goverbs/goverbs/provider/iwarp" // device tcp0, addresses tcp://host:port
	_ "github.com/goverbs/goverbs/provider/loop"  // device loop0, addresses loop://name
	_ "github.com/goverbs/goverbs/provider/shm"   // device shm0, addresses shm://@name and shm:///path.sock
)
