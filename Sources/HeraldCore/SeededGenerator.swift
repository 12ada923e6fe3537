/// A small, fast, seeded random generator (SplitMix64). Every random choice in HeraldLab comes
/// from one of these, so the same seed gives the same run.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    /// A generator for one named stream of a run, independent of the others.
    public init(seed: UInt64, stream: String) {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in stream.utf8 { h = (h ^ UInt64(b)) &* 0x0000_0100_0000_01B3 }
        state = seed ^ h
        _ = next()
    }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    public mutating func nextUnit() -> Double { Double(next() >> 11) * 0x1.0p-53 }

    /// Standard normal (Box-Muller).
    public mutating func nextGaussian() -> Double {
        var u = nextUnit()
        if u < 1e-300 { u = 1e-300 }
        let v = nextUnit()
        return (-2 * _log(u)).squareRoot() * _cos(2 * Double.pi * v)
    }
}

#if canImport(Glibc)
import Glibc
@inline(__always) private func _log(_ x: Double) -> Double { Glibc.log(x) }
@inline(__always) private func _cos(_ x: Double) -> Double { Glibc.cos(x) }
#else
import Foundation
@inline(__always) private func _log(_ x: Double) -> Double { Foundation.log(x) }
@inline(__always) private func _cos(_ x: Double) -> Double { Foundation.cos(x) }
#endif
