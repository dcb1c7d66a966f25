#if canImport(Glibc)
import Glibc
#endif

let pylonVersionEcho = "1.0.0"

func sleepSeconds(_ s: UInt32) { _ = sleep(s) }
func abortNow() -> Never { abort() }
