r"""TF Addons' NMT tutorial (seq2seq with attention) on `tf_recurrent.seq2seq`.

The tutorial `docs/tutorials/networks_seq2seq_nmt.ipynb` of tensorflow/addons
("Sequence-to-Sequence NMT with Attention Mechanism") as a script: an LSTM
encoder, an `AttentionWrapper(LSTMCell, LuongAttention)` decoder trained
through `BasicDecoder` + `TrainingSampler`, greedy translation with
`BasicDecoder` + `GreedyEmbeddingSampler`, and beam-search translation with
`BeamSearchDecoder` + `tile_batch` (`--beam_width`, 0 skips it). Its model
code (the `Encoder` and `Decoder` classes, `loss_function`, `train_step`,
`evaluate_sentence`, `translate`, `beam_evaluate_sentence`,
`beam_translate`) is the tutorial's, `tfa.seq2seq.X` read as `seq2seq.X`
(`from tf_recurrent import seq2seq`), except for these differences:

Keras 2 -> Keras 3 (unavoidable):

1. `tf.keras.X` is `keras.X`, Keras 3's own import: `tf_recurrent.seq2seq`
   is Keras 3, and `tf.keras` is tf_keras (Keras 2) where
   TF_USE_LEGACY_KERAS=1 is set.
2. Keras 3 has no `keras.preprocessing.text.Tokenizer`: `Tokenizer` below
   is its subset the tutorial uses (`filters`, `oov_token`,
   `fit_on_texts`, `texts_to_sequences`, `sequences_to_texts`,
   `word_index`), with Keras 2's numbering (tests/test_tpu_examples.py
   compares it with tf_keras's).
3. `tf.keras.preprocessing.sequence.pad_sequences` is
   `keras.preprocessing.sequence.pad_sequences`.

Other differences:

4. Data: no network at run time. The tutorial downloads spa-eng (30,000
   English-Spanish pairs); `download_nmt` here writes a generated corpus in
   the same `English<TAB>Spanish` format instead (`synthetic_pairs`: a
   small grammar with Spanish's noun genders, adjectives after the noun,
   personal "a", "al", "¿...?" and verb endings), so the tutorial's
   cleaning code runs unchanged on it.
5. `sklearn.model_selection.train_test_split` is a seeded function of the
   same signature below (scikit-learn is no dependency).
6. The sizes are flags, small by default (the tutorial: 30,000 examples,
   batch 64, embedding 256, 1024 units, 10 epochs), so the script runs
   in 1-2 minutes on 2 CPU cores; checkpoints go to --checkpoint_dir (a
   temporary directory by default) instead of ./training_checkpoints.
   `main` runs the notebook's top-level cells in order (their globals
   declared `global`, as the model code reads them), printing what the
   notebook's cells displayed, after seeding Keras (--data_seed); it
   translates sentences of the generated corpus's grammar (`SENTENCES`)
   instead of the tutorial's, whose words are not in its vocabulary.
7. The decoders in `evaluate_sentence` and `beam_evaluate_sentence` get
   `maximum_iterations=max_length_output`, and `beam_translate` cuts a
   beam at '<end>' only where it has one: the tutorial's unbounded loops
   never end for a model that never emits '<end>' (a barely trained one).
   `beam_translate` takes the beam width (the tutorial's fixed 3).

Example:

    python -m tpu_examples.train_nmt                 # 1-2 minutes on 2 cores
    python -m tpu_examples.train_nmt --epochs=20 --units=256 --beam_width=5
"""

import io
import os
import re
import tempfile
import time
import unicodedata
from typing import List, Sequence, Tuple

from absl import app
from absl import flags
import keras
import numpy as np
import tensorflow as tf

from tf_recurrent import seq2seq

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_examples", 6000, "Sentence pairs (the tutorial: "
                     "30000 of spa-eng).")
flags.DEFINE_integer("batch_size", 64, "Batch size (BATCH_SIZE).")
flags.DEFINE_integer("embedding_dim", 64, "Embedding size (the tutorial: "
                     "256).")
flags.DEFINE_integer("units", 128, "Encoder and decoder LSTM units (the "
                     "tutorial: 1024).")
flags.DEFINE_integer("epochs", 15, "Training epochs (EPOCHS; the tutorial: "
                     "10).")
flags.DEFINE_integer("steps_per_epoch", 0, "Batches per epoch; 0: "
                     "num_examples // batch_size, as the tutorial.")
flags.DEFINE_integer("beam_width", 3, "Beam width of the beam-search "
                     "translations; 0: greedy translations only.")
flags.DEFINE_integer("data_seed", 0, "Seed of the corpus, its split and the "
                     "weights' initialization.")
flags.DEFINE_string("checkpoint_dir", "", "Checkpoints; empty: a temporary "
                    "directory.")

# Spanish sentences the tutorial's translate() calls get: in the corpus's
# grammar, not necessarily in its training split.
SENTENCES = [u"el gato negro ve a la niña.", u"¿dónde está la casa roja?",
             u"el perro es grande.", u"ella quiere una manzana."]


# The corpus: English-Spanish pairs from a small grammar.

# English, Spanish, gender, a person (takes the personal "a").
_NOUNS = [("cat", "gato", "m", False), ("dog", "perro", "m", False),
          ("house", "casa", "f", False), ("book", "libro", "m", False),
          ("table", "mesa", "f", False), ("car", "coche", "m", False),
          ("window", "ventana", "f", False), ("tree", "árbol", "m", False),
          ("apple", "manzana", "f", False), ("girl", "niña", "f", True),
          ("boy", "niño", "m", True), ("teacher", "maestro", "m", True)]
# English, Spanish masculine, Spanish feminine.
_ADJECTIVES = [("red", "rojo", "roja"), ("black", "negro", "negra"),
               ("small", "pequeño", "pequeña"), ("big", "grande", "grande"),
               ("white", "blanco", "blanca"), ("new", "nuevo", "nueva"),
               ("old", "viejo", "vieja"), ("pretty", "bonito", "bonita")]
# English (I/we, he/she), Spanish (I, we, he/she).
_VERBS = [(("see", "sees"), ("veo", "vemos", "ve")),
          (("have", "has"), ("tengo", "tenemos", "tiene")),
          (("want", "wants"), ("quiero", "queremos", "quiere")),
          (("buy", "buys"), ("compro", "compramos", "compra")),
          (("find", "finds"), ("encuentro", "encontramos", "encuentra")),
          (("need", "needs"), ("necesito", "necesitamos", "necesita"))]
# English, Spanish, the verb form (0: I, 1: we, 2: he/she), Spanish drops it.
_PRONOUNS = [("I", "", 0), ("We", "", 1), ("He", "él", 2), ("She", "ella", 2)]


def _adjective(rng, noun):
  # People are not described by colours here.
  choices = [a for a in _ADJECTIVES
             if not noun[3] or a[0] not in ("red", "black", "white")]
  return choices[rng.integers(len(choices))]


def _noun_phrase(rng, definite=None, people=True):
  """(English, Spanish, noun) of a random noun phrase, e.g. ("the red
  house", "la casa roja")."""
  nouns = [n for n in _NOUNS if people or not n[3]]
  noun = nouns[rng.integers(len(nouns))]
  english, spanish, gender, _ = noun
  if definite is None:
    definite = bool(rng.integers(2))
  if definite:
    en_det, es_det = "the", "el" if gender == "m" else "la"
  else:
    en_det, es_det = "a", "un" if gender == "m" else "una"
  if rng.integers(2):
    adjective = _adjective(rng, noun)
    english = f"{adjective[0]} {english}"
    spanish = f"{spanish} {adjective[1] if gender == 'm' else adjective[2]}"
  if en_det == "a" and english[0] in "aeiou":
    en_det = "an"
  return f"{en_det} {english}", f"{es_det} {spanish}", noun


def _object(rng, verb):
  # One has, wants and buys things only.
  people = verb[0][0] in ("see", "find", "need")
  english, spanish, noun = _noun_phrase(rng, people=people)
  if noun[3]:  # A person takes the personal "a"; "a el" is "al".
    spanish = "al" + spanish[2:] if spanish.startswith("el ") else "a " + spanish
  return english, spanish


def _sentence(rng) -> Tuple[str, str]:
  kind = rng.integers(4)
  if kind == 0:  # The noun phrase does something to another.
    subject_en, subject_es, _ = _noun_phrase(rng)
    verb = _VERBS[rng.integers(len(_VERBS))]
    object_en, object_es = _object(rng, verb)
    english = f"{subject_en} {verb[0][1]} {object_en}."
    spanish = f"{subject_es} {verb[1][2]} {object_es}."
  elif kind == 1:  # A pronoun does something to a noun phrase.
    pronoun = _PRONOUNS[rng.integers(len(_PRONOUNS))]
    verb = _VERBS[rng.integers(len(_VERBS))]
    object_en, object_es = _object(rng, verb)
    english = f"{pronoun[0]} {verb[0][pronoun[2] // 2]} {object_en}."
    spanish = f"{pronoun[1]} {verb[1][pronoun[2]]} {object_es}.".strip()
  elif kind == 2:  # The noun phrase is so.
    subject_en, subject_es, noun = _noun_phrase(rng)
    adjective = _adjective(rng, noun)
    english = f"{subject_en} is {adjective[0]}."
    spanish = (f"{subject_es} es "
               f"{adjective[1] if noun[2] == 'm' else adjective[2]}.")
  else:  # Where is it?
    subject_en, subject_es, _ = _noun_phrase(rng, definite=True)
    english = f"Where is {subject_en}?"
    spanish = f"¿Dónde está {subject_es}?"
  english = english[0].upper() + english[1:]
  spanish = spanish.replace("¿d", "¿D")
  return english, spanish[0].upper() + spanish[1:]


def synthetic_pairs(count: int, seed: int = 0) -> List[Tuple[str, str]]:
  """`count` distinct (English, Spanish) sentence pairs of a small grammar.

  Args:
    count: How many pairs.
    seed: The generator's seed.

  Returns:
    The pairs, in the order generated.

  Example:

  >>> for english, spanish in synthetic_pairs(3, seed=74):
  ...   print(f"{english} | {spanish}")
  A pretty boy finds the girl. | Un niño bonito encuentra a la niña.
  The window is red. | La ventana es roja.
  Where is the apple? | ¿Dónde está la manzana?
  """
  rng = np.random.default_rng(seed)
  pairs, seen = [], set()
  while len(pairs) < count:
    pair = _sentence(rng)
    if pair not in seen:
      seen.add(pair)
      pairs.append(pair)
  return pairs


def download_nmt():
  """Writes the corpus as spa-eng's `spa.txt` is (English<TAB>Spanish per
  line); returns its path. The tutorial downloads spa-eng here."""
  path = os.path.join(tempfile.mkdtemp(prefix="nmt_"), "spa.txt")
  with io.open(path, "w", encoding="UTF-8") as f:
    f.write("\n".join(f"{english}\t{spanish}" for english, spanish in
                      synthetic_pairs(FLAGS.num_examples, FLAGS.data_seed)))
  return path


class Tokenizer:
  """The part of Keras 2's `keras.preprocessing.text.Tokenizer` the
  tutorial uses (Keras 3 has none).

  Words are split on spaces (after lowering the text and deleting the
  `filters` characters); ids count from 1 in order of decreasing
  frequency (ties: first seen first), the `oov_token` first; an unknown
  word (or id) becomes the `oov_token`.

  Args:
    filters: Characters deleted from the texts.
    oov_token: The word unknown words become (None: they are dropped).
    lower: Whether to lower the texts.

  Example:

  >>> tokenizer = Tokenizer(filters="", oov_token="<OOV>")
  >>> tokenizer.fit_on_texts(["a b b", "c b"])
  >>> tokenizer.word_index
  {'<OOV>': 1, 'b': 2, 'a': 3, 'c': 4}
  >>> tokenizer.texts_to_sequences(["b d a"])
  [[2, 1, 3]]
  >>> tokenizer.sequences_to_texts([[4, 2, 0]])
  ['c b <OOV>']
  """

  def __init__(self, filters: str = "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\t\n",
               oov_token: str = None, lower: bool = True):
    self.filters = filters
    self.oov_token = oov_token
    self.lower = lower
    self.word_counts = {}
    self.word_index = {}
    self.index_word = {}

  def _words(self, text: str) -> List[str]:
    if self.lower:
      text = text.lower()
    text = text.translate(str.maketrans({c: " " for c in self.filters}))
    return [word for word in text.split(" ") if word]

  def fit_on_texts(self, texts: Sequence[str]) -> None:
    """Counts the words of `texts` and numbers them."""
    for text in texts:
      for word in self._words(text):
        self.word_counts[word] = self.word_counts.get(word, 0) + 1
    # A stable sort: words of equal counts keep their first-seen order.
    words = sorted(self.word_counts, key=self.word_counts.get, reverse=True)
    if self.oov_token is not None:
      words = [self.oov_token] + words
    self.word_index = {word: i + 1 for i, word in enumerate(words)}
    self.index_word = {i: word for word, i in self.word_index.items()}

  def texts_to_sequences(self, texts: Sequence[str]) -> List[List[int]]:
    """Each text's word ids."""
    oov = self.word_index.get(self.oov_token)
    return [[self.word_index.get(word, oov) for word in self._words(text)
             if word in self.word_index or oov is not None]
            for text in texts]

  def sequences_to_texts(self, sequences) -> List[str]:
    """Each id sequence's words, joined by spaces."""
    oov = self.word_index.get(self.oov_token)
    texts = []
    for sequence in sequences:
      words = []
      for i in sequence:
        word = self.index_word.get(int(i))
        if word is not None:
          words.append(word)
        elif self.oov_token is not None:
          words.append(self.index_word[oov])
      texts.append(" ".join(words))
    return texts


def train_test_split(*arrays, test_size: float = 0.25):
  """Shuffles the rows (the same permutation for each array) and splits
  off the last `test_size` of them, as scikit-learn's does.

  Returns:
    `[train_0, test_0, train_1, test_1, ...]`.

  Example:

  >>> a_train, a_test = train_test_split(np.arange(10), test_size=0.2)
  >>> len(a_train), len(a_test), sorted(np.concatenate([a_train, a_test]).tolist())
  (8, 2, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
  """
  count = len(arrays[0])
  test = int(np.ceil(test_size * count))
  order = np.random.default_rng(FLAGS["data_seed"].value).permutation(count)
  split = []
  for array in arrays:
    array = np.asarray(array)[order]
    split += [array[:count - test], array[count - test:]]
  return split


# The tutorial's data preparation, unchanged but for the Tokenizer.


class NMTDataset:
    def __init__(self, problem_type='en-spa'):
        self.problem_type = 'en-spa'
        self.inp_lang_tokenizer = None
        self.targ_lang_tokenizer = None


    def unicode_to_ascii(self, s):
        return ''.join(c for c in unicodedata.normalize('NFD', s) if unicodedata.category(c) != 'Mn')

    ## Step 1 and Step 2
    def preprocess_sentence(self, w):
        w = self.unicode_to_ascii(w.lower().strip())

        # creating a space between a word and the punctuation following it
        # eg: "he is a boy." => "he is a boy ."
        # Reference:- https://stackoverflow.com/questions/3645931/python-padding-punctuation-with-white-spaces-keeping-punctuation
        w = re.sub(r"([?.!,¿])", r" \1 ", w)
        w = re.sub(r'[" "]+', " ", w)

        # replacing everything with space except (a-z, A-Z, ".", "?", "!", ",")
        w = re.sub(r"[^a-zA-Z?.!,¿]+", " ", w)

        w = w.strip()

        # adding a start and an end token to the sentence
        # so that the model know when to start and stop predicting.
        w = '<start> ' + w + ' <end>'
        return w

    def create_dataset(self, path, num_examples):
        # path : path to spa-eng.txt file
        # num_examples : Limit the total number of training example for faster training (set num_examples = len(lines) to use full data)
        lines = io.open(path, encoding='UTF-8').read().strip().split('\n')
        word_pairs = [[self.preprocess_sentence(w) for w in l.split('\t')]  for l in lines[:num_examples]]

        return zip(*word_pairs)

    # Step 3 and Step 4
    def tokenize(self, lang):
        # lang = list of sentences in a language

        # print(len(lang), "example sentence: {}".format(lang[0]))
        lang_tokenizer = Tokenizer(filters='', oov_token='<OOV>')
        lang_tokenizer.fit_on_texts(lang)

        ## tf.keras.preprocessing.text.Tokenizer.texts_to_sequences converts string (w1, w2, w3, ......, wn)
        ## to a list of correspoding integer ids of words (id_w1, id_w2, id_w3, ...., id_wn)
        tensor = lang_tokenizer.texts_to_sequences(lang)

        ## tf.keras.preprocessing.sequence.pad_sequences takes argument a list of integer id sequences
        ## and pads the sequences to match the longest sequences in the given input
        tensor = keras.preprocessing.sequence.pad_sequences(tensor, padding='post')

        return tensor, lang_tokenizer

    def load_dataset(self, path, num_examples=None):
        # creating cleaned input, output pairs
        targ_lang, inp_lang = self.create_dataset(path, num_examples)

        input_tensor, inp_lang_tokenizer = self.tokenize(inp_lang)
        target_tensor, targ_lang_tokenizer = self.tokenize(targ_lang)

        return input_tensor, target_tensor, inp_lang_tokenizer, targ_lang_tokenizer

    def call(self, num_examples, BUFFER_SIZE, BATCH_SIZE):
        file_path = download_nmt()
        input_tensor, target_tensor, self.inp_lang_tokenizer, self.targ_lang_tokenizer = self.load_dataset(file_path, num_examples)

        input_tensor_train, input_tensor_val, target_tensor_train, target_tensor_val = train_test_split(input_tensor, target_tensor, test_size=0.2)

        train_dataset = tf.data.Dataset.from_tensor_slices((input_tensor_train, target_tensor_train))
        train_dataset = train_dataset.shuffle(BUFFER_SIZE).batch(BATCH_SIZE, drop_remainder=True)

        val_dataset = tf.data.Dataset.from_tensor_slices((input_tensor_val, target_tensor_val))
        val_dataset = val_dataset.batch(BATCH_SIZE, drop_remainder=True)

        return train_dataset, val_dataset, self.inp_lang_tokenizer, self.targ_lang_tokenizer


# The tutorial's model code: tfa.seq2seq is seq2seq, tf.keras is keras.


class Encoder(keras.Model):
  def __init__(self, vocab_size, embedding_dim, enc_units, batch_sz):
    super(Encoder, self).__init__()
    self.batch_sz = batch_sz
    self.enc_units = enc_units
    self.embedding = keras.layers.Embedding(vocab_size, embedding_dim)

    ##-------- LSTM layer in Encoder ------- ##
    self.lstm_layer = keras.layers.LSTM(self.enc_units,
                                   return_sequences=True,
                                   return_state=True,
                                   recurrent_initializer='glorot_uniform')



  def call(self, x, hidden):
    x = self.embedding(x)
    output, h, c = self.lstm_layer(x, initial_state = hidden)
    return output, h, c

  def initialize_hidden_state(self):
    return [tf.zeros((self.batch_sz, self.enc_units)), tf.zeros((self.batch_sz, self.enc_units))]


class Decoder(keras.Model):
  def __init__(self, vocab_size, embedding_dim, dec_units, batch_sz, attention_type='luong'):
    super(Decoder, self).__init__()
    self.batch_sz = batch_sz
    self.dec_units = dec_units
    self.attention_type = attention_type

    # Embedding Layer
    self.embedding = keras.layers.Embedding(vocab_size, embedding_dim)

    #Final Dense layer on which softmax will be applied
    self.fc = keras.layers.Dense(vocab_size)

    # Define the fundamental cell for decoder recurrent structure
    self.decoder_rnn_cell = keras.layers.LSTMCell(self.dec_units)



    # Sampler
    self.sampler = seq2seq.sampler.TrainingSampler()

    # Create attention mechanism with memory = None
    self.attention_mechanism = self.build_attention_mechanism(self.dec_units,
                                                              None, self.batch_sz*[max_length_input], self.attention_type)

    # Wrap attention mechanism with the fundamental rnn cell of decoder
    self.rnn_cell = self.build_rnn_cell(batch_sz)

    # Define the decoder with respect to fundamental rnn cell
    self.decoder = seq2seq.BasicDecoder(self.rnn_cell, sampler=self.sampler, output_layer=self.fc)


  def build_rnn_cell(self, batch_sz):
    rnn_cell = seq2seq.AttentionWrapper(self.decoder_rnn_cell,
                                  self.attention_mechanism, attention_layer_size=self.dec_units)
    return rnn_cell

  def build_attention_mechanism(self, dec_units, memory, memory_sequence_length, attention_type='luong'):
    # ------------- #
    # typ: Which sort of attention (Bahdanau, Luong)
    # dec_units: final dimension of attention outputs
    # memory: encoder hidden states of shape (batch_size, max_length_input, enc_units)
    # memory_sequence_length: 1d array of shape (batch_size) with every element set to max_length_input (for masking purpose)

    if(attention_type=='bahdanau'):
      return seq2seq.BahdanauAttention(units=dec_units, memory=memory, memory_sequence_length=memory_sequence_length)
    else:
      return seq2seq.LuongAttention(units=dec_units, memory=memory, memory_sequence_length=memory_sequence_length)

  def build_initial_state(self, batch_sz, encoder_state, Dtype):
    decoder_initial_state = self.rnn_cell.get_initial_state(batch_size=batch_sz, dtype=Dtype)
    decoder_initial_state = decoder_initial_state.clone(cell_state=encoder_state)
    return decoder_initial_state


  def call(self, inputs, initial_state):
    x = self.embedding(inputs)
    outputs, _, _ = self.decoder(x, initial_state=initial_state, sequence_length=self.batch_sz*[max_length_output-1])
    return outputs


def loss_function(real, pred):
  # real shape = (BATCH_SIZE, max_length_output)
  # pred shape = (BATCH_SIZE, max_length_output, tar_vocab_size )
  cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction='none')
  loss = cross_entropy(y_true=real, y_pred=pred)
  mask = tf.logical_not(tf.math.equal(real,0))   #output 0 for y=0 else output 1
  mask = tf.cast(mask, dtype=loss.dtype)
  loss = mask* loss
  loss = tf.reduce_mean(loss)
  return loss


@tf.function
def train_step(inp, targ, enc_hidden):
  loss = 0

  with tf.GradientTape() as tape:
    enc_output, enc_h, enc_c = encoder(inp, enc_hidden)


    dec_input = targ[ : , :-1 ] # Ignore <end> token
    real = targ[ : , 1: ]         # ignore <start> token

    # Set the AttentionMechanism object with encoder_outputs
    decoder.attention_mechanism.setup_memory(enc_output)

    # Create AttentionWrapperState as initial_state for decoder
    decoder_initial_state = decoder.build_initial_state(BATCH_SIZE, [enc_h, enc_c], tf.float32)
    pred = decoder(dec_input, decoder_initial_state)
    logits = pred.rnn_output
    loss = loss_function(real, logits)

  variables = encoder.trainable_variables + decoder.trainable_variables
  gradients = tape.gradient(loss, variables)
  optimizer.apply_gradients(zip(gradients, variables))

  return loss


def evaluate_sentence(sentence):
  sentence = dataset_creator.preprocess_sentence(sentence)

  inputs = [inp_lang.word_index[i] for i in sentence.split(' ')]
  inputs = keras.preprocessing.sequence.pad_sequences([inputs],
                                                          maxlen=max_length_input,
                                                          padding='post')
  inputs = tf.convert_to_tensor(inputs)
  inference_batch_size = inputs.shape[0]
  result = ''

  enc_start_state = [tf.zeros((inference_batch_size, units)), tf.zeros((inference_batch_size,units))]
  enc_out, enc_h, enc_c = encoder(inputs, enc_start_state)

  dec_h = enc_h
  dec_c = enc_c

  start_tokens = tf.fill([inference_batch_size], targ_lang.word_index['<start>'])
  end_token = targ_lang.word_index['<end>']

  greedy_sampler = seq2seq.GreedyEmbeddingSampler()

  # Instantiate BasicDecoder object
  decoder_instance = seq2seq.BasicDecoder(cell=decoder.rnn_cell, sampler=greedy_sampler, output_layer=decoder.fc, maximum_iterations=max_length_output)
  # Setup Memory in decoder stack
  decoder.attention_mechanism.setup_memory(enc_out)

  # set decoder_initial_state
  decoder_initial_state = decoder.build_initial_state(inference_batch_size, [enc_h, enc_c], tf.float32)


  ### Since the BasicDecoder wraps around Decoder's rnn cell only, you have to ensure that the inputs to BasicDecoder
  ### decoding step is output of embedding layer. tfa.seq2seq.GreedyEmbeddingSampler() takes care of this.
  ### You only need to get the weights of embedding layer, which can be done by decoder.embedding.variables[0] and pass this callabble to BasicDecoder's call() function

  decoder_embedding_matrix = decoder.embedding.variables[0]

  outputs, _, _ = decoder_instance(decoder_embedding_matrix, start_tokens = start_tokens, end_token= end_token, initial_state=decoder_initial_state)
  return outputs.sample_id.numpy()

def translate(sentence):
  result = evaluate_sentence(sentence)
  print(result)
  result = targ_lang.sequences_to_texts(result)
  print('Input: %s' % (sentence))
  print('Predicted translation: {}'.format(result))


def beam_evaluate_sentence(sentence, beam_width=3):
  sentence = dataset_creator.preprocess_sentence(sentence)

  inputs = [inp_lang.word_index[i] for i in sentence.split(' ')]
  inputs = keras.preprocessing.sequence.pad_sequences([inputs],
                                                          maxlen=max_length_input,
                                                          padding='post')
  inputs = tf.convert_to_tensor(inputs)
  inference_batch_size = inputs.shape[0]
  result = ''

  enc_start_state = [tf.zeros((inference_batch_size, units)), tf.zeros((inference_batch_size,units))]
  enc_out, enc_h, enc_c = encoder(inputs, enc_start_state)

  dec_h = enc_h
  dec_c = enc_c

  start_tokens = tf.fill([inference_batch_size], targ_lang.word_index['<start>'])
  end_token = targ_lang.word_index['<end>']

  # From official documentation
  # NOTE If you are using the BeamSearchDecoder with a cell wrapped in AttentionWrapper, then you must ensure that:
  # The encoder output has been tiled to beam_width via tfa.seq2seq.tile_batch (NOT tf.tile).
  # The batch_size argument passed to the get_initial_state method of this wrapper is equal to true_batch_size * beam_width.
  # The initial state created with get_initial_state above contains a cell_state value containing properly tiled final state from the encoder.

  enc_out = seq2seq.tile_batch(enc_out, multiplier=beam_width)
  decoder.attention_mechanism.setup_memory(enc_out)
  print("beam_with * [batch_size, max_length_input, rnn_units] :  3 * [1, 16, 1024]] :", enc_out.shape)

  # set decoder_inital_state which is an AttentionWrapperState considering beam_width
  hidden_state = seq2seq.tile_batch([enc_h, enc_c], multiplier=beam_width)
  decoder_initial_state = decoder.rnn_cell.get_initial_state(batch_size=beam_width*inference_batch_size, dtype=tf.float32)
  decoder_initial_state = decoder_initial_state.clone(cell_state=hidden_state)

  # Instantiate BeamSearchDecoder
  decoder_instance = seq2seq.BeamSearchDecoder(decoder.rnn_cell,beam_width=beam_width, output_layer=decoder.fc, maximum_iterations=max_length_output)
  decoder_embedding_matrix = decoder.embedding.variables[0]

  # The BeamSearchDecoder object's call() function takes care of everything.
  outputs, final_state, sequence_lengths = decoder_instance(decoder_embedding_matrix, start_tokens=start_tokens, end_token=end_token, initial_state=decoder_initial_state)
  # outputs is tfa.seq2seq.FinalBeamSearchDecoderOutput object.
  # The final beam predictions are stored in outputs.predicted_id
  # outputs.beam_search_decoder_output is a tfa.seq2seq.BeamSearchDecoderOutput object which keep tracks of beam_scores and parent_ids while performing a beam decoding step
  # final_state = tfa.seq2seq.BeamSearchDecoderState object.
  # Sequence Length = [inference_batch_size, beam_width] details the maximum length of the beams that are generated


  # outputs.predicted_id.shape = (inference_batch_size, time_step_outputs, beam_width)
  # outputs.beam_search_decoder_output.scores.shape = (inference_batch_size, time_step_outputs, beam_width)
  # Convert the shape of outputs and beam_scores to (inference_batch_size, beam_width, time_step_outputs)
  final_outputs = tf.transpose(outputs.predicted_ids, perm=(0,2,1))
  beam_scores = tf.transpose(outputs.beam_search_decoder_output.scores, perm=(0,2,1))

  return final_outputs.numpy(), beam_scores.numpy()


def beam_translate(sentence, beam_width=3):
  result, beam_scores = beam_evaluate_sentence(sentence, beam_width)
  print(result.shape, beam_scores.shape)
  for beam, score in zip(result, beam_scores):
    print(beam.shape, score.shape)
    output = targ_lang.sequences_to_texts(beam)
    output = [a[:a.index('<end>')] if '<end>' in a else a for a in output]
    beam_score = [a.sum() for a in score]
    print('Input: %s' % (sentence))
    for i in range(len(output)):
      print('{} Predicted translation: {}  {}'.format(i+1, output[i], beam_score[i]))


def main(argv):
  """The tutorial's cells in order, its globals set from the flags."""
  del argv
  # The tutorial's code reads these as its notebook's globals.
  global BUFFER_SIZE, BATCH_SIZE, num_examples, dataset_creator
  global train_dataset, val_dataset, inp_lang, targ_lang
  global vocab_inp_size, vocab_tar_size, max_length_input, max_length_output
  global embedding_dim, units, steps_per_epoch, encoder, decoder, optimizer
  keras.utils.set_random_seed(FLAGS.data_seed)
  start_time = time.time()

  BUFFER_SIZE = 32000
  BATCH_SIZE = FLAGS.batch_size
  num_examples = FLAGS.num_examples

  dataset_creator = NMTDataset('en-spa')
  train_dataset, val_dataset, inp_lang, targ_lang = dataset_creator.call(num_examples, BUFFER_SIZE, BATCH_SIZE)

  example_input_batch, example_target_batch = next(iter(train_dataset))
  print(example_input_batch.shape, example_target_batch.shape)

  vocab_inp_size = len(inp_lang.word_index)+1
  vocab_tar_size = len(targ_lang.word_index)+1
  max_length_input = example_input_batch.shape[1]
  max_length_output = example_target_batch.shape[1]

  embedding_dim = FLAGS.embedding_dim
  units = FLAGS.units
  steps_per_epoch = FLAGS.steps_per_epoch or num_examples//BATCH_SIZE

  print("max_length_english, max_length_spanish, vocab_size_english, vocab_size_spanish")
  print(max_length_input, max_length_output, vocab_inp_size, vocab_tar_size)

  ## Test Encoder Stack

  encoder = Encoder(vocab_inp_size, embedding_dim, units, BATCH_SIZE)


  # sample input
  sample_hidden = encoder.initialize_hidden_state()
  sample_output, sample_h, sample_c = encoder(example_input_batch, sample_hidden)
  print ('Encoder output shape: (batch size, sequence length, units) {}'.format(sample_output.shape))
  print ('Encoder h vecotr shape: (batch size, units) {}'.format(sample_h.shape))
  print ('Encoder c vector shape: (batch size, units) {}'.format(sample_c.shape))

  # Test decoder stack

  decoder = Decoder(vocab_tar_size, embedding_dim, units, BATCH_SIZE, 'luong')
  sample_x = tf.random.uniform((BATCH_SIZE, max_length_output))
  decoder.attention_mechanism.setup_memory(sample_output)
  initial_state = decoder.build_initial_state(BATCH_SIZE, [sample_h, sample_c], tf.float32)


  sample_decoder_outputs = decoder(sample_x, initial_state)

  print("Decoder Outputs Shape: ", sample_decoder_outputs.rnn_output.shape)

  optimizer = keras.optimizers.Adam()

  checkpoint_dir = FLAGS.checkpoint_dir or tempfile.mkdtemp(prefix="nmt_")
  checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")
  checkpoint = tf.train.Checkpoint(optimizer=optimizer,
                                   encoder=encoder,
                                   decoder=decoder)

  EPOCHS = FLAGS.epochs

  for epoch in range(EPOCHS):
    start = time.time()

    enc_hidden = encoder.initialize_hidden_state()
    total_loss = 0
    # print(enc_hidden[0].shape, enc_hidden[1].shape)

    for (batch, (inp, targ)) in enumerate(train_dataset.take(steps_per_epoch)):
      batch_loss = train_step(inp, targ, enc_hidden)
      total_loss += batch_loss

      if batch % 100 == 0:
        print('Epoch {} Batch {} Loss {:.4f}'.format(epoch + 1,
                                                     batch,
                                                     batch_loss.numpy()))
    # saving (checkpoint) the model every 2 epochs
    if (epoch + 1) % 2 == 0:
      checkpoint.save(file_prefix = checkpoint_prefix)

    print('Epoch {} Loss {:.4f}'.format(epoch + 1,
                                        total_loss / steps_per_epoch))
    print('Time taken for 1 epoch {} sec\n'.format(time.time() - start))

  # restoring the latest checkpoint in checkpoint_dir
  checkpoint.restore(tf.train.latest_checkpoint(checkpoint_dir))

  for sentence in SENTENCES:
    translate(sentence)
  if FLAGS.beam_width:
    for sentence in SENTENCES[:2]:
      beam_translate(sentence, FLAGS.beam_width)
  print(f"done in {time.time() - start_time:.0f} s")


if __name__ == "__main__":
  app.run(main)
