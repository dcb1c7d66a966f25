import CLibUV

#if canImport(Glibc)
import Glibc
#endif

/// A spawned child process (`uv_spawn`). The handle is closed after the exit callback.
public final class ChildProcess: UVHandleOwner {
    public struct Options {
        public var exec: String
        public var args: [String] = []
        public var env: [String] = []
        /// (fd number in the child, descriptor in the parent) pairs inherited by the child.
        public var inheritFds: [(child: Int32, parent: Int32)] = []
        public var stdout: Connection?
        public var stderr: Connection?
        public var uid: UInt32?
        public var gid: UInt32?
        /// Puts the child in its own session (`setsid`), so terminal signals reach only the host.
        public var detached = true
        public init(exec: String) { self.exec = exec }
    }

    let handle = UVHandle<uv_process_t>()
    public private(set) var pid: Int32 = -1
    private var onExit: (_ status: Int64, _ signal: Int32) -> Void
    public private(set) var exited = false

    public init(loop: Loop, options o: Options, onExit: @escaping (Int64, Int32) -> Void) throws(UVError) {
        self.onExit = onExit

        var cStrings: [UnsafeMutablePointer<CChar>?] = []
        defer { for p in cStrings { free(p) } }
        func c(_ s: String) -> UnsafeMutablePointer<CChar>? {
            let p = strdup(s)
            cStrings.append(p)
            return p
        }
        var argv: [UnsafeMutablePointer<CChar>?] = [c(o.exec)] + o.args.map { c($0) } + [nil]
        var envp: [UnsafeMutablePointer<CChar>?] = o.env.map { c($0) } + [nil]
        let file = c(o.exec)

        let nfds = max(3, Int(o.inheritFds.map { $0.child }.max() ?? 0) + 1)
        var stdio = [uv_stdio_container_t](repeating: uv_stdio_container_t(), count: nfds)
        for i in 0..<nfds { stdio[i].flags = UV_IGNORE }
        if let out = o.stdout {
            stdio[1].flags = uv_stdio_flags(UV_CREATE_PIPE.rawValue | UV_WRITABLE_PIPE.rawValue)
            stdio[1].data.stream = out.stream
        }
        if let err = o.stderr {
            stdio[2].flags = uv_stdio_flags(UV_CREATE_PIPE.rawValue | UV_WRITABLE_PIPE.rawValue)
            stdio[2].data.stream = err.stream
        }
        for (child, parent) in o.inheritFds {
            stdio[Int(child)].flags = UV_INHERIT_FD
            stdio[Int(child)].data.fd = parent
        }

        var opts = uv_process_options_t()
        opts.file = UnsafePointer(file)
        opts.exit_cb = { p, status, sig in
            Unmanaged<ChildProcess>.fromOpaque(p!.pointee.data).takeUnretainedValue().didExit(status, sig)
        }
        var flags: UInt32 = 0
        if o.detached { flags |= UV_PROCESS_DETACHED.rawValue }
        if let uid = o.uid { flags |= UV_PROCESS_SETUID.rawValue; opts.uid = uid }
        if let gid = o.gid { flags |= UV_PROCESS_SETGID.rawValue; opts.gid = gid }
        opts.flags = flags
        handle.retain(self)

        let rc: Int32 = argv.withUnsafeMutableBufferPointer { av in
            envp.withUnsafeMutableBufferPointer { ev in
                stdio.withUnsafeMutableBufferPointer { sv in
                    opts.args = av.baseAddress
                    opts.env = ev.baseAddress
                    opts.stdio_count = Int32(sv.count)
                    opts.stdio = sv.baseAddress
                    return uv_spawn(loop.uv, handle.pointer, &opts)
                }
            }
        }
        if rc < 0 {
            exited = true
            handle.close()  // uv_spawn requires uv_close even on failure
            throw UVError(rc, "spawn \(o.exec)")
        }
        pid = handle.pointer.pointee.pid
    }

    /// Sends `signal` (`uv_process_kill`). Ignored once the process has exited.
    public func kill(_ signal: Int32) {
        guard !exited else { return }
        uv_process_kill(handle.pointer, signal)
    }

    private func didExit(_ status: Int64, _ sig: Int32) {
        exited = true
        let cb = onExit
        onExit = { _, _ in }
        cb(status, sig)
        handle.close()
    }
}
