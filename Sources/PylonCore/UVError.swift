import CLibUV

/// A libuv (negative errno) error code with its message.
public struct UVError: Error, Equatable, Sendable, CustomStringConvertible {
    public let code: Int32
    public let context: String
    public init(_ code: Int32, _ context: String = "") { self.code = code; self.context = context }
    public var message: String { String(cString: uv_strerror(code)) }
    public var description: String { context.isEmpty ? message : "\(context): \(message)" }

}

/// A libuv handle of any concrete type viewed as `uv_handle_t` (libuv's C "inheritance").
@inline(__always)
public func asHandle<T>(_ p: UnsafeMutablePointer<T>) -> UnsafeMutablePointer<uv_handle_t> {
    UnsafeMutableRawPointer(p).assumingMemoryBound(to: uv_handle_t.self)
}
/// A libuv stream handle (`uv_pipe_t`, `uv_tcp_t`, …) viewed as `uv_stream_t`.
@inline(__always)
public func asStream<T>(_ p: UnsafeMutablePointer<T>) -> UnsafeMutablePointer<uv_stream_t> {
    UnsafeMutableRawPointer(p).assumingMemoryBound(to: uv_stream_t.self)
}
