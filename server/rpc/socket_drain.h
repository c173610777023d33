// Waiting for this process's TCP sockets to hand their unsent bytes to the peer before a drain
// closes the connections.
#pragma once

#include <chrono>
#include <cstdint>

namespace opserve {

// The bytes this process's TCP sockets have queued and the peers have not yet acknowledged
// (the sum of SIOCOUTQ over /proc/self/fd). Listening sockets, Unix sockets and other
// descriptors count 0.
uint64_t UnacknowledgedSocketBytes();

// Polls UnacknowledgedSocketBytes() until it reads 0 or `deadline` passes; true when it read 0.
//
// Why: a call's OnDone means gRPC has written its response into the kernel, not that the client
// has it. A large response can still sit in the send queue while the client's window is full.
// Closing the connection then (grpc_server_cancel_all_calls disconnects every transport) while
// the client still sends anything (a WINDOW_UPDATE, the next request) makes the kernel answer
// with a reset, and the unsent tail is dropped: the client sees "Connection reset by peer"
// for a call the server completed.
bool WaitForSocketsToFlush(std::chrono::system_clock::time_point deadline);

}  // namespace opserve
