// Command probe is what the real node's tests run in a pod to see its network: the Go standard
// library's resolver and dialer, built statically (no libc, no NSS) into the test image.
//
//	probe lookup NAME         print NAME's addresses, one a line (the pod's /etc/resolv.conf)
//	probe connect HOST:PORT   connect over TCP; print "connected" and exit 0, else exit 1
//	probe serve PORT          answer every TCP connection with "probe" and a newline
//	probe await NAME TRIES    look NAME up until it resolves, TRIES times 2 s apart; print its
//	                          addresses and exit 0, else exit 1 (training-operator's init container)
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"
)

func main() {
	arguments := 3
	if len(os.Args) > 1 && os.Args[1] == "await" {
		arguments = 4
	}
	if len(os.Args) != arguments {
		fmt.Fprintln(os.Stderr, "usage: probe lookup NAME | connect HOST:PORT | serve PORT | await NAME TRIES")
		os.Exit(2)
	}
	if os.Args[1] == "await" {
		os.Exit(await(os.Args[2], os.Args[3]))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	switch os.Args[1] {
	case "lookup":
		addresses, err := net.DefaultResolver.LookupHost(ctx, os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for _, address := range addresses {
			fmt.Println(address)
		}
	case "connect":
		var dialer net.Dialer
		connection, err := dialer.DialContext(ctx, "tcp", os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		connection.Close()
		fmt.Println("connected")
	case "serve":
		listener, err := net.Listen("tcp", ":"+os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for {
			connection, err := listener.Accept()
			if err != nil {
				continue
			}
			fmt.Fprintln(connection, "probe")
			connection.Close()
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}

// await looks name up until it resolves, at most tries times, 2 s apart; the exit code.
func await(name, tries string) int {
	var count int
	if _, err := fmt.Sscan(tries, &count); err != nil || count < 1 {
		fmt.Fprintln(os.Stderr, "TRIES must be a positive integer:", tries)
		return 2
	}
	for try := 1; try <= count; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addresses, err := net.DefaultResolver.LookupHost(ctx, name)
		cancel()
		if err == nil {
			for _, address := range addresses {
				fmt.Println(address)
			}
			return 0
		}
		fmt.Println("waiting for", name+":", err)
		time.Sleep(2 * time.Second)
	}
	return 1
}
