module github.com/goverbs/goverbs

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
