package main

import (
	"io"
	"log"
	"net"
	"sync"
)

// relayForever accepts a client on the CSI socket, then the next connection
// on the TCP address, relays the two, and repeats; it returns only by exiting.
func relayForever(socket, address string) {
	clients, err := net.Listen("unix", socket)
	if err != nil {
		fail("listen on %s: %v", socket, err)
	}
	upstream, err := net.Listen("tcp", address)
	if err != nil {
		fail("listen on %s: %v", address, err)
	}
	log.Printf("relaying %s to the connections arriving on %s", socket, address)
	for {
		client, err := clients.Accept()
		if err != nil {
			fail("accept on %s: %v", socket, err)
		}
		server, err := upstream.Accept()
		if err != nil {
			fail("accept on %s: %v", address, err)
		}
		go relay(client, server)
	}
}

// relay copies bytes both ways; when either direction ends, both
// connections close.
func relay(a, b net.Conn) {
	var once sync.Once
	done := func() {
		once.Do(func() {
			a.Close()
			b.Close()
		})
	}
	go func() {
		io.Copy(a, b)
		done()
	}()
	io.Copy(b, a)
	done()
}
