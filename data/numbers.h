// The built-in corpus: English number words and their German translations, 0 to 999,999, so that a
// fresh machine trains a real translator with no download ("three hundred and twenty-four" ->
// "dreihundertvierundzwanzig": German puts units before tens and writes the whole number as one word).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

// British English: "one hundred and five", "two thousand and seven", "twenty-one thousand three hundred".
std::string english_number(long n);
// German: "eins" alone and at the end ("hunderteins"), "ein" inside ("einundzwanzig", "eintausend");
// 100 and 1000 are "einhundert" and "eintausend" (the spoken short forms "hundert", "tausend" are not used).
std::string german_number(long n);

struct NumberPair {
  long n;
  std::string en, de;
};
struct NumberCorpus {
  std::vector<NumberPair> train, val, test;  // disjoint
};
// Numbers drawn from a fixed seed: first a length of 1 to 6 digits, uniformly, then a number of that
// length, uniformly, so that small numbers are as present as large ones; no number appears twice.
NumberCorpus number_corpus(uint64_t seed, int train, int val, int test);
