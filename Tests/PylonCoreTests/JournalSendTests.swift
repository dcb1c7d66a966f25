import CJournal
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The journal's native protocol without libsystemd (Sources/CJournal): what journald reads from
/// its socket, byte for byte, sent to a datagram socket of the test's own.
@Suite struct JournalSendTests {
    /// A bound datagram socket standing in for /run/systemd/journal/socket.
    func journalSocket(_ path: String) -> Int32 {
        unlink(path)
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var sa = sockaddr_un()
        sa.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &sa.sun_path) { raw in
            raw.copyBytes(from: Array(path.utf8))
            raw[path.utf8.count] = 0
        }
        let rc = withUnsafePointer(to: &sa) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        #expect(rc == 0)
        return fd
    }

    /// Sends `fields` ("FIELD=value") to `path`; the call's result.
    func send(_ path: String, _ fields: [String]) -> Int32 {
        let items = fields.map { Array($0.utf8) }
        var iov: [iovec] = []
        func go(_ i: Int) -> Int32 {
            guard i < items.count else {
                return iov.withUnsafeBufferPointer { pylon_journal_sendv_to(path, $0.baseAddress, Int32($0.count)) }
            }
            return items[i].withUnsafeBytes { b in
                iov.append(iovec(iov_base: UnsafeMutableRawPointer(mutating: b.baseAddress), iov_len: b.count))
                return go(i + 1)
            }
        }
        return go(0)
    }

    func receive(_ fd: Int32) -> [UInt8] {
        var buf = [UInt8](repeating: 0, count: 65536)
        let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        return n > 0 ? Array(buf[0..<n]) : []
    }

    /// Plain fields end with a newline; a value holding a newline goes as name, newline, its
    /// length (64-bit little-endian) and the bytes.
    @Test func oneDatagramInJournaldsFormat() {
        let path = "/tmp/pylon-journal-\(getpid()).sock"
        let fd = journalSocket(path)
        defer { close(fd); unlink(path) }
        #expect(send(path, ["MESSAGE=hello", "PRIORITY=6", "PYLON_REASON=two\nlines"]) == 0)
        let expected =
            Array("MESSAGE=hello\nPRIORITY=6\nPYLON_REASON\n".utf8) + [9, 0, 0, 0, 0, 0, 0, 0] + Array("two\nlines\n".utf8)
        #expect(receive(fd) == expected)
        // An empty value is a field too.
        #expect(send(path, ["MESSAGE="]) == 0)
        #expect(receive(fd) == Array("MESSAGE=\n".utf8))
    }

    /// What is not a field, an entry over the bound and a journal that is not there are errors
    /// (the logger then writes the line to stderr); nothing is sent for the first two.
    @Test func refusalsAreErrorsAndSendNothing() {
        let path = "/tmp/pylon-journal-refuse-\(getpid()).sock"
        let fd = journalSocket(path)
        defer { close(fd); unlink(path) }
        #expect(send(path, ["MESSAGE=ok", "no equals sign"]) == -EINVAL)
        #expect(send(path, ["=value"]) == -EINVAL)
        #expect(send(path, []) == -EINVAL)
        let big = "MESSAGE=" + String(repeating: "x", count: Int(PYLON_JOURNAL_MAX_ENTRY_BYTES))
        #expect(send(path, [big]) == -EMSGSIZE)
        #expect(receive(fd).isEmpty)
        #expect(send("/tmp/pylon-journal-absent-\(getpid()).sock", ["MESSAGE=x"]) < 0)
    }
}
