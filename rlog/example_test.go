package rlog_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/goverbs/goverbs/rlog"

	_ "github.com/goverbs/goverbs/provider/loop" // addresses loop://name
)

// A log of three members in one process: two replicas and a primary.
// The client's appends return once a majority holds them durably. ScanDir
// then tails the primary's log, which it reads from the member's data
// directory while the member runs, each record checked (goverbs log tail
// does the same). Across processes or hosts the addresses are shm://@name
// or tcp://host:port.
func Example() {
	dir, err := os.MkdirTemp("", "rlog-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	members := []string{"loop://rlog-ex-0", "loop://rlog-ex-1", "loop://rlog-ex-2"}
	// Every member holds the same secret; read it from a file that only
	// the members' owner may read (goverbs log serve --secret-file).
	secret := []byte("an example secret: use 32 random bytes")
	ctx := context.Background()
	for i := 2; i >= 0; i-- { // the replicas first: the primary needs a majority
		m, err := rlog.Start(ctx, rlog.Config{
			Dir:     filepath.Join(dir, fmt.Sprint(i)),
			Listen:  members[i],
			Members: members,
			Primary: i == 0,
			Secret:  secret,
		})
		if err != nil {
			log.Fatal(err)
		}
		defer m.Close()
	}
	c, err := rlog.Dial(ctx, members...)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for _, rec := range []string{"begin", "debit 10", "credit 10", "commit"} {
		seq, err := c.Append(ctx, []byte(rec))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("appended", seq, rec)
	}
	res, err := rlog.ScanDir(filepath.Join(dir, "0"), 2, func(r rlog.Record) error {
		fmt.Printf("tail %d %q\n", r.Seq, r.Data)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("records", res.First, "to", res.Last)
	// Output:
	// appended 1 begin
	// appended 2 debit 10
	// appended 3 credit 10
	// appended 4 commit
	// tail 2 "debit 10"
	// tail 3 "credit 10"
	// tail 4 "commit"
	// records 1 to 4
}
